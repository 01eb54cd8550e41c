# Project-wide helpers: every project target goes through freekv_target() so that warnings and
# sanitizers are target-scoped and never touch the global CMAKE_C_FLAGS.

# freekv_target(TARGET [GENERATED]) — GENERATED targets (protoc-c output) get no -Werror.
function(freekv_target tgt)
  cmake_parse_arguments(FT "GENERATED" "" "" ${ARGN})
  if(NOT FT_GENERATED)
    target_compile_options(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Werror>)
  endif()
  target_compile_definitions(${tgt} PRIVATE _GNU_SOURCE)
  if(NOT FREEKV_SANITIZE STREQUAL "OFF")
    target_compile_options(${tgt} PRIVATE
      $<$<COMPILE_LANGUAGE:C>:-fsanitize=${FREEKV_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
    target_link_options(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:C>:-fsanitize=${FREEKV_SANITIZE}>)
    get_target_property(type ${tgt} TYPE)
    if(type STREQUAL "EXECUTABLE")
      target_link_options(${tgt} PRIVATE -fsanitize=${FREEKV_SANITIZE})
    endif()
  endif()
endfunction()

# freekv_add_test(NAME SOURCES a.c b.c LIBS x y LABELS unit [TIMEOUT s])
# One cmocka executable per module; GPU tests skip with exit code 77.
function(freekv_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  freekv_target(${name})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(${name} PRIVATE PkgConfig::CMOCKA ${T_LIBS})
  target_compile_definitions(${name} PRIVATE
    FREEKV_MODELS_DIR="${FREEKV_MODELS_DIR}"
    FREEKV_BUILD_DIR="${PROJECT_BINARY_DIR}"
    FREEKV_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  add_test(NAME ${name} COMMAND ${name})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}" SKIP_RETURN_CODE 77 TIMEOUT ${T_TIMEOUT})
  if(FREEKV_SANITIZE MATCHES "thread")
    # history_size=7: keep OpenMP workers' stacks so the libgomp suppression can match them;
    # suppress_equal_addresses=0: its per-report linear scan over every suppressed address made
    # test_backend_cpu run past its timeout (tests/tsan.supp says why there are so many).
    set_property(TEST ${name} APPEND PROPERTY ENVIRONMENT
      "TSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/tsan.supp history_size=7 suppress_equal_addresses=0")
  endif()
endfunction()

# Sets FREEKV_HAVE_CUDA and enables the CUDA language when FREEKV_CUDA allows and nvcc exists.
macro(freekv_detect_cuda)
  set(FREEKV_HAVE_CUDA OFF)
  if(NOT FREEKV_CUDA STREQUAL "OFF")
    if(NOT CMAKE_CUDA_COMPILER)
      if(DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS "$ENV{CUDAToolkit_ROOT}/bin/nvcc")
        set(CMAKE_CUDA_COMPILER "$ENV{CUDAToolkit_ROOT}/bin/nvcc")
      elseif(CUDAToolkit_ROOT AND EXISTS "${CUDAToolkit_ROOT}/bin/nvcc")
        set(CMAKE_CUDA_COMPILER "${CUDAToolkit_ROOT}/bin/nvcc")
      elseif(EXISTS "/usr/local/cuda/bin/nvcc")
        set(CMAKE_CUDA_COMPILER "/usr/local/cuda/bin/nvcc")
      endif()
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      if(NOT CMAKE_CUDA_ARCHITECTURES)
        # sm_80 and sm_90 machine code, plus compute_90 PTX for newer parts.
        set(CMAKE_CUDA_ARCHITECTURES "80-real;90")
      endif()
      enable_language(CUDA)
      find_package(CUDAToolkit REQUIRED)
      set(FREEKV_HAVE_CUDA ON)
    elseif(FREEKV_CUDA STREQUAL "ON")
      message(FATAL_ERROR "FREEKV_CUDA=ON but no nvcc was found (set CUDAToolkit_ROOT)")
    endif()
  endif()
endmacro()
