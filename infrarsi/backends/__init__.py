"""Trial backends: the real job (``process``) and the cluster simulator (``sim``) behind one
interface, ``Backend``; ``backend_of(spec)`` is a campaign's."""

from infrarsi.backends.backend import Backend, Pool, backend_of

__all__ = ["Backend", "Pool", "backend_of"]
