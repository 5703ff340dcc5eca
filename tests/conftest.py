import os

# every kernel's output dtype is checked against the model's inferred type in tests
os.environ.setdefault("RUNTIME_CORE_CHECK_KERNELS", "1")
