# e8kv-eval --svg on a small real run (label model): the picture is written and is well-formed XML
# (parsed by Python's xml.etree), with a marker per row; the table and CSV are written beside it.
# Prints "SKIPPED:" (the test's skip expression) without the fetched model and corpora, unless
# E8KV_REQUIRE_DATA=1 (CI), where that is a failure.
if(DEFINED ENV{E8KV_CACHE} AND NOT "$ENV{E8KV_CACHE}" STREQUAL "")
  set(cache "$ENV{E8KV_CACHE}")
else()
  set(cache "$ENV{HOME}/.cache/e8kv")
endif()
if(DEFINED ENV{E8KV_MODEL} AND NOT "$ENV{E8KV_MODEL}" STREQUAL "")
  set(model "$ENV{E8KV_MODEL}")
else()
  set(model "${cache}/models/SmolLM2-135M-Instruct.Q4_1.gguf")
endif()
foreach(f "${model}" "${cache}/text/tech.txt" "${cache}/text/fiction.txt")
  if(NOT EXISTS "${f}")
    if("$ENV{E8KV_REQUIRE_DATA}" STREQUAL "1")
      message(FATAL_ERROR "${f} is absent and E8KV_REQUIRE_DATA=1 (scripts/fetch-data.sh fetches it)")
    endif()
    message("SKIPPED: ${f} is absent (scripts/fetch-data.sh fetches it)")
    return()
  endif()
endforeach()
if(NOT PYTHON OR PYTHON MATCHES "NOTFOUND")
  message(FATAL_ERROR "python3 is needed to parse the SVG (scripts/setup.sh installs it)")
endif()
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
execute_process(COMMAND "${EVAL}" --ctx 128 --cont 4 --chunks 2 --no-niah --quiet
                        --only "q4_0 (rotated),KIVI-2,e8kv quant-k3v2"
                        --svg "${OUT}/quality.svg" --md "${OUT}/eval.md" --csv "${OUT}/eval.csv"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "e8kv-eval failed (${rc}):\n${out}\n${err}")
endif()
if(NOT err STREQUAL "")
  message(FATAL_ERROR "--quiet still wrote to stderr:\n${err}")
endif()
foreach(f quality.svg eval.md eval.csv)
  if(NOT EXISTS "${OUT}/${f}")
    message(FATAL_ERROR "${OUT}/${f} was not written")
  endif()
endforeach()
execute_process(COMMAND "${PYTHON}" -c [=[
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
assert root.tag == ns + "svg", root.tag
texts = ["".join(t.itertext()) for t in root.iter(ns + "text")]
for want in ("fp16 (KL 0)", "q4_0 (rotated)", "KIVI-2", "quant-k3v2", "e8kv presets", "Pareto front"):
    assert any(want == t for t in texts), (want, texts)
print("svg ok:", len(texts), "labels")
]=] "${OUT}/quality.svg" RESULT_VARIABLE prc OUTPUT_VARIABLE pout ERROR_VARIABLE perr)
if(NOT prc EQUAL 0)
  message(FATAL_ERROR "${OUT}/quality.svg is not well-formed or lacks a label:\n${pout}\n${perr}")
endif()
message("${pout}")
