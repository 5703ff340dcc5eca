"""The official BackendTest adds a CUDA variant of every case; runtime_core.backend on CUDA needs
a GPU provider, exercised by tests/providers/cuda and `nox -s gpu`, so those are deselected here."""


def pytest_collection_modifyitems(config, items):
    cuda = [i for i in items if i.name.endswith("_cuda")]
    if cuda:
        config.hook.pytest_deselected(items=cuda)
        items[:] = [i for i in items if not i.name.endswith("_cuda")]
