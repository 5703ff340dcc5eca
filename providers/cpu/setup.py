"""The one compiled part of runtime-provider-cpu: ``runtime_provider_cpu._native`` (plain C
against the CPython API, no numpy headers). Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "runtime_provider_cpu._native",
    ["runtime_provider_cpu/_native.c"],
    extra_compile_args=["-O3", "-funroll-loops", "-fno-math-errno", "-Wno-psabi"],
)])
