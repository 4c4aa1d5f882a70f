# kagent_unit_test(NAME SOURCES file.c... LIBS lib... [TIMEOUT s] [LABELS l...])
#   One cmocka program per module, registered as one ctest with a timeout.
function(kagent_unit_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} PkgConfig::CMOCKA Threads::Threads)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "unit;${T_LABELS}")
endfunction()

# kagent_script_test(NAME COMMAND cmd args... [TIMEOUT s] [LABELS l...] [NEEDS_PG])
#   An integration test run by a script. NEEDS_PG wraps it in tests/with-pg, which starts a
#   private PostgreSQL for this test alone and exports PGHOST/PGPORT/PGUSER/PGDATABASE.
function(kagent_script_test name)
  cmake_parse_arguments(T "NEEDS_PG" "TIMEOUT" "COMMAND;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set(cmd ${T_COMMAND})
  if(T_NEEDS_PG)
    set(cmd ${PROJECT_SOURCE_DIR}/tests/with-pg ${cmd})
  endif()
  add_test(NAME ${name} COMMAND ${cmd})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "integration;${T_LABELS}"
    ENVIRONMENT "KAGENT_BUILD_DIR=${PROJECT_BINARY_DIR};KAGENT_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()

# kagent_add_subdirs(): add every direct subdirectory that has a CMakeLists.txt, sorted.
# Lets each module own its directory without editing a shared list.
macro(kagent_add_subdirs)
  file(GLOB _kagent_children LIST_DIRECTORIES true RELATIVE ${CMAKE_CURRENT_SOURCE_DIR}
       ${CMAKE_CURRENT_SOURCE_DIR}/*)
  list(SORT _kagent_children)
  foreach(_child ${_kagent_children})
    if(IS_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/${_child}
       AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${_child}/CMakeLists.txt)
      add_subdirectory(${_child})
    endif()
  endforeach()
endmacro()

# kagent_static_executable(target): links target statically, for programs that run inside any
# tools image or before any library can be trusted (the guest, kagent-spawn). Sanitizers do not
# support static executables, so they are stripped from the target in ASan builds.
function(kagent_static_executable target)
  get_target_property(_copts ${target} COMPILE_OPTIONS)
  get_target_property(_lopts ${target} LINK_OPTIONS)
  foreach(_v _copts _lopts)
    if(${_v})
      list(FILTER ${_v} EXCLUDE REGEX "sanitize")
    else()
      set(${_v} "")
    endif()
  endforeach()
  set_target_properties(${target} PROPERTIES COMPILE_OPTIONS "${_copts}"
                        LINK_OPTIONS "${_lopts};-static")
  target_compile_options(${target} PRIVATE -fno-sanitize=all)
endfunction()
