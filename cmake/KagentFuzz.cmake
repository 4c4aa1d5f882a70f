# KAGENT_FUZZ: every library is instrumented for libFuzzer (coverage) with ASan and UBSan; the
# targets of tests/fuzz link libFuzzer's main. clang and its fuzzer runtime are required.
if(NOT CMAKE_C_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "KAGENT_FUZZ=ON needs clang (configure with CC=clang or "
                      "-DCMAKE_C_COMPILER=clang; `make fuzz` does), not ${CMAKE_C_COMPILER_ID}")
endif()
if(KAGENT_SANITIZE)
  message(FATAL_ERROR "KAGENT_FUZZ=ON already builds with ASan+UBSan: leave KAGENT_SANITIZE off")
endif()
include(CheckCSourceCompiles)
set(CMAKE_REQUIRED_FLAGS "-fsanitize=fuzzer,address,undefined")
check_c_source_compiles("
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return (int)(n && d[0]); }"
  KAGENT_HAVE_LIBFUZZER)
unset(CMAKE_REQUIRED_FLAGS)
if(NOT KAGENT_HAVE_LIBFUZZER)
  message(FATAL_ERROR "clang cannot link -fsanitize=fuzzer: install clang's runtime "
                      "(Debian 12: libclang-rt-14-dev; deploy/install-deps.sh does)")
endif()
set(KAGENT_FUZZ_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined)
add_compile_options(-fsanitize=fuzzer-no-link ${KAGENT_FUZZ_FLAGS})
add_link_options(${KAGENT_FUZZ_FLAGS})
