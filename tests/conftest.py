import os

# every kernel's output dtype is checked against the model's inferred type in tests
os.environ.setdefault("RUNTIME_CORE_CHECK_KERNELS", "1")
# the CPU provider runs in-place variants on tensors of every size in tests (by default it skips
# them below 4096 elements, where the ownership test costs more than it saves): the suite's small
# tensors then exercise them all; tests/providers/cpu/test_inplace.py checks the default
os.environ.setdefault("RUNTIME_CORE_CPU_INPLACE_MIN", "0")
# the CPU provider's kernel choices (measured on first runs) stay in the test process: no file
# under ~/.cache; tests/providers/cpu/test_autotune.py sets a folder of its own
os.environ.setdefault("RUNTIME_CORE_AUTOTUNE_DIR", "0")
