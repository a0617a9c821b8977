"""Context-manager and finalizer boilerplate shared by the loaders that wrap ``Loader``."""

from __future__ import annotations

from typing import Self


class ClosingMixin:
    """``with`` support and a best-effort ``close()`` at garbage collection.

    The class defines an idempotent ``close()``; ``__del__`` swallows errors because a finalizer
    may run during interpreter shutdown, when modules it needs are already gone.
    """

    def close(self) -> None:  # overridden
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
