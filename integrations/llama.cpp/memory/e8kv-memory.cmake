# Included by the patched llama.cpp's src/CMakeLists.txt (patches/llama-e8kv-memory.patch):
# compiles e8kv's KV memory into libllama and links the e8kv library, which comes from e8kv's own
# tree when llama.cpp is built on its own (scripts/llama-cpp-kv-types.sh, scripts/build-llama-cpp.sh)
# and is already a target when e8kv builds llama.cpp (integrations/llama.cpp/engine).
get_filename_component(_e8kv_memory_root "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if (NOT TARGET e8kv)
    set(E8KV_CUDA OFF CACHE BOOL "" FORCE)
    add_subdirectory(${_e8kv_memory_root} ${CMAKE_BINARY_DIR}/e8kv EXCLUDE_FROM_ALL)
endif()
# llama.cpp's own split: the memory (sequences, state), a sequence (stage, chunks, windows), the
# model's layers (architectures, RoPE, windows), the graph op and its thread gang.
set(_e8kv_memory_sources
    ${CMAKE_CURRENT_LIST_DIR}/e8kv_memory.cpp
    ${CMAKE_CURRENT_LIST_DIR}/e8kv_sequence.cpp
    ${CMAKE_CURRENT_LIST_DIR}/e8kv_layers.cpp
    ${CMAKE_CURRENT_LIST_DIR}/e8kv_attention.cpp
    ${CMAKE_CURRENT_LIST_DIR}/e8kv_op_gang.cpp)
target_sources(llama PRIVATE ${_e8kv_memory_sources})
# memory_state.hpp (the state's format, header constants only) from the adapter's include dir.
target_include_directories(llama PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_CURRENT_LIST_DIR}/../include)
target_link_libraries(llama PRIVATE $<BUILD_INTERFACE:e8kv>)
if (CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    # e8kv's adapter code is built optimized even where libllama is not (the engine test's -O0)
    set_source_files_properties(${_e8kv_memory_sources} PROPERTIES COMPILE_OPTIONS "-O2")
endif()
