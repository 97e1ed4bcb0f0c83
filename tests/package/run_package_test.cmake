# Installs the built e8kv into a scratch prefix, then configures, builds and runs the consumer
# projects (C++: consumer.cpp; C only: c/consumer_c.c through the C ABI) against (1) the install
# prefix and (2) the build tree.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} --install "${E8KV_BUILD_DIR}" --prefix "${prefix}")

foreach(kind install buildtree)
  if(kind STREQUAL "install")
    set(loc "-DCMAKE_PREFIX_PATH=${prefix}")
  else()
    set(loc "-De8kv_DIR=${E8KV_BUILD_DIR}")
  endif()
  set(bin "${WORK_DIR}/consumer-${kind}")
  run(${CMAKE_COMMAND} -S "${CONSUMER_SOURCE}" -B "${bin}" -G "${GENERATOR}" ${loc} -DCMAKE_BUILD_TYPE=Release)
  run(${CMAKE_COMMAND} --build "${bin}")
  run("${bin}/e8kv_consumer")
  message(STATUS "consumer against the ${kind} package: OK")
  set(cbin "${WORK_DIR}/c-consumer-${kind}")
  run(${CMAKE_COMMAND} -S "${CONSUMER_SOURCE}/c" -B "${cbin}" -G "${GENERATOR}" ${loc} -DCMAKE_BUILD_TYPE=Release)
  run(${CMAKE_COMMAND} --build "${cbin}")
  run("${cbin}/e8kv_c_consumer")
  message(STATUS "C consumer (C ABI) against the ${kind} package: OK")
endforeach()

# The quickstart example builds and runs against the installed package too.
set(qs "${WORK_DIR}/quickstart")
run(${CMAKE_COMMAND} -S "${CONSUMER_SOURCE}/../../examples/quickstart" -B "${qs}" -G "${GENERATOR}"
    "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build "${qs}")
run("${qs}/quickstart")
message(STATUS "examples/quickstart against the installed package: OK")
