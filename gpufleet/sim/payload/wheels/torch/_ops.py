"""A small torch.ops registry so kernels can be looked up as torch.ops.<namespace>.<op>."""


class _OpNamespace:
    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, op: str):
        raise AttributeError(f"'_OpNamespace' '{self.name}' object has no attribute '{op}'")


class _Ops:
    def __init__(self):
        self._namespaces: dict[str, _OpNamespace] = {}

    def __getattr__(self, name: str) -> _OpNamespace:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._namespaces.setdefault(name, _OpNamespace(name))

    def _register(self, namespace: str, name: str, fn) -> None:
        setattr(getattr(self, namespace), name, fn)


ops = _Ops()
