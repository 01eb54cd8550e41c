# worker/model.cmake — model loading: GGUF and safetensors readers, Hugging Face config.json,
# model_load() with the fingerprint, and the synthetic-model writer.
target_sources(freekv_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/gguf.c
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.c
  ${CMAKE_CURRENT_LIST_DIR}/hf_config.c
  ${CMAKE_CURRENT_LIST_DIR}/model.c
  ${CMAKE_CURRENT_LIST_DIR}/synth.c)
target_link_libraries(freekv_runtime PUBLIC PkgConfig::JSONC PkgConfig::CRYPTO OpenMP::OpenMP_C)
