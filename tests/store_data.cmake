# tests/store_data.cmake — unit tests of kvstored's data side (kvstore/slab, pool, journal, tier,
# ring).
freekv_add_test(test_slab SOURCES test_slab.c LIBS freekv_store_service LABELS unit)
freekv_add_test(test_pool SOURCES test_pool.c LIBS freekv_store_service LABELS unit)
freekv_add_test(test_journal SOURCES test_journal.c LIBS freekv_store_service LABELS unit)
freekv_add_test(test_tier SOURCES test_tier.c LIBS freekv_store_service LABELS unit)
freekv_add_test(test_ring SOURCES test_ring.c LIBS freekv_store LABELS unit)
