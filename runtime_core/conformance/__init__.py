"""The ONNX backend test suite, run against runtime-core (``runtime-core conformance``).

``cases`` finds the 2033 cases of the suite shipped in the ``onnx`` package (node cases
are generated once into a cache folder), ``compare`` holds the official comparison
rules, ``runner`` runs every case isolated in worker processes and tabulates the
results, ``exclusions`` reads the commented list of cases known not to pass.
"""
