# Every external library comes from Debian 12 through pkg-config (deploy/install-deps.sh installs them).
# Each becomes an imported target PkgConfig::<NAME>; a missing one stops the configure step with its name.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)

# msgpack-c is "msgpack" in Debian 12 (4.x) and "msgpack-c" upstream from 6.x.
pkg_check_modules(MSGPACK QUIET IMPORTED_TARGET msgpack-c)
if(NOT MSGPACK_FOUND)
  pkg_check_modules(MSGPACK REQUIRED IMPORTED_TARGET msgpack)
endif()

pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)
pkg_check_modules(CZMQ REQUIRED IMPORTED_TARGET libczmq)
pkg_check_modules(PROTOBUFC REQUIRED IMPORTED_TARGET libprotobuf-c)
pkg_check_modules(PQ REQUIRED IMPORTED_TARGET libpq)
pkg_check_modules(YAML REQUIRED IMPORTED_TARGET yaml-0.1)
pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)
pkg_check_modules(MHD REQUIRED IMPORTED_TARGET libmicrohttpd)
pkg_check_modules(JANSSON REQUIRED IMPORTED_TARGET jansson)
pkg_check_modules(ARCHIVE REQUIRED IMPORTED_TARGET libarchive)
pkg_check_modules(SECCOMP REQUIRED IMPORTED_TARGET libseccomp)
pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
pkg_check_modules(CRYPTO REQUIRED IMPORTED_TARGET libcrypto)

# gRPC C core: link only grpc and gpr (the ~100 absl libraries in grpc.pc are not needed for
# dynamic linking, see reference/feasibility-notes.md section 1).
find_library(GRPC_LIB grpc REQUIRED)
find_library(GPR_LIB gpr REQUIRED)
add_library(kagent_grpc INTERFACE)
target_link_libraries(kagent_grpc INTERFACE ${GRPC_LIB} ${GPR_LIB})

find_program(PROTOC_C protoc-c REQUIRED)
