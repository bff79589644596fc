"""llama.cpp as the judge: the oracle worker (llama-cpp-python's cb_eval and logs), llama.cpp's tools,
and ``graphcost verify``. Only tests, benchmarks and ``verify`` import it."""
