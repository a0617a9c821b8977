"""Lifecycle and stats scaffolding shared by the loaders that wrap :class:`headrace.Loader`.

The audio, video and image loaders each run an inner ``Loader`` over data they own (media files
or image records) and add a decoding transform. What they do around it is the same: ``with`` and
a finalizer, an idempotent ``close()`` that stops the threads before releasing the data,
``print_stats()`` as the inner loader's report plus one line of their own, decode errors raised
in a worker re-raised as they were, the ``Loader`` keywords passed through unchanged, and the
inner loader's source: a view of the records that leaves closing them to the wrapper. Those
live here, so each loader states only what differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, Self

import numpy as np

from headrace._base.errors import ConfigError, DecodeError, LoaderError
from headrace._engine.history import delivered, token_at
from headrace._engine.seeds import SeededUser
from headrace._engine.timeline import TimelineMixin

if TYPE_CHECKING:
    from headrace._engine.loader import Loader
    from headrace._sources.media import MediaFiles

__all__ = [
    "INNER_LOADER_KEYWORDS",
    "YIELD_KEY",
    "BorrowedRecords",
    "ClosingMixin",
    "EmptyStreak",
    "InnerState",
    "LoaderWrapper",
    "SingleLoaderWrapper",
    "ThenTransform",
    "refuse_empty",
]

#: the keywords of ``audio()``, ``video()`` and ``image()`` that go to the inner ``Loader`` as
#: they are (their meaning is the Loader's: docs/api.md)
INNER_LOADER_KEYWORDS = ("threads", "inflight", "ram_gb", "queue", "prefetch", "profile",
                         "constraints", "runtime", "rank", "world_size", "tail", "tune",
                         "batch_bytes", "target_bytes")

#: where a user ``transform``'s result travels in a decoded batch (see :class:`ThenTransform`)
YIELD_KEY = "__headrace_yield__"


class _Records(Protocol):
    """What :class:`BorrowedRecords` needs of ``MediaFiles`` / ``ImageRecords``."""

    def __len__(self) -> int: ...

    @property
    def fingerprint(self) -> str: ...

    def payload_nbytes(self, ids: np.ndarray) -> int: ...

    def record_nbytes(self, ids: np.ndarray) -> np.ndarray: ...


class BorrowedRecords:
    """The inner ``Loader``'s source over records that the wrapping loader owns.

    ``close()`` does nothing: the wrapper closes the records itself, after the threads stopped,
    and may hand them on (the image loader's epochs and ``mix`` rebuilds reuse them). A batch
    holds what ``gather`` returns: the payloads the records copy into memory (views of a mapping
    cost nothing) plus an int64 label per record. Subclasses define ``gather``.
    """

    def __init__(self, records: _Records) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    @property
    def fingerprint(self) -> str:
        return self.records.fingerprint

    def nbytes(self, ids: np.ndarray) -> int:
        return self.records.payload_nbytes(ids) + 8 * len(ids)

    def record_nbytes(self, ids: np.ndarray) -> np.ndarray:
        """The records' encoded bytes, what ``batch_bytes``/``target_bytes`` count."""
        return self.records.record_nbytes(ids)

    def close(self) -> None:
        pass


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


class ThenTransform:
    """A decoding transform followed by the user's ``transform(batch, ids)``, in the workers.

    A user transform that declares ``rng`` / ``seeds`` gets them keyed by ``(seed, epoch, id)``
    of the ids it is given (``_engine.seeds``).

    The user's function sees the batch exactly as the loader yields it (``finish`` builds that
    from the decoded dict: a tuple, torch tensors, ...) and what it returns is what the loader
    yields: the wrapper's ``next()`` hands out ``batch[YIELD_KEY]``. A batch whose records all
    failed is left alone (it is never yielded). Holds no reference to the loader object.
    """

    takes_epoch = True  # the engine passes the batch's epoch: the user's seeds need it

    def __init__(self, decode: Callable[[Any, np.ndarray], dict[str, Any]] | None,
                 finish: Callable[[dict[str, Any]], Any], user: Callable[..., Any],
                 ids_key: str, seed: int = 0) -> None:
        if not callable(user):
            raise ConfigError(f"transform must be a function (batch, ids) -> batch, got {user!r}")
        self.decode = decode
        self.finish = finish
        self.user = SeededUser(user, seed)
        self.ids_key = ids_key

    def __call__(self, batch: Any, ids: np.ndarray, epoch: int = 0) -> dict[str, Any]:
        b = batch if self.decode is None else self.decode(batch, ids)
        if len(b[self.ids_key]) == 0:
            return b
        out = dict(b)
        out[YIELD_KEY] = self.user(self.finish(b), np.asarray(b[self.ids_key]).copy(), epoch)
        return out


def refuse_empty(count: int, what: str, data: Any) -> None:
    """A loader over data with no records is an error at construction, never an empty (or, when
    endless, a spinning) stream."""
    if count == 0:
        raise ConfigError(f"{data!r} holds no {what}: there is nothing to load; check the path "
                          "(and the file extensions it holds)")


class EmptyStreak:
    """Ends a stream where every record fails under a skip/count policy, in bounded time.

    A batch whose records all failed is passed over by the loader; if that goes on for two
    epochs' worth of records in a row (sixteen with ``order="iid"``, which may miss records in
    an epoch), or a finite run ends having delivered nothing but failures, there is nothing to
    yield: ``DecodeError`` instead of a spin (endless) or a silently empty run.
    """

    def __init__(self, inner: Loader, policy: str) -> None:
        per_rank = -(-inner.length // max(1, inner.world_size))
        epochs = 16 if inner._mode.name == "IID" else 2
        self.limit = max(1, per_rank * epochs)
        self.policy = policy
        self.run = 0
        self.delivered = False

    def empty(self, records: int) -> None:
        """``records`` more failed in a row; raises once the limit is reached."""
        self.run += records
        if self.run >= self.limit:
            self._raise(f"the last {self.run} records in a row all failed")

    def full(self) -> None:
        self.run = 0
        self.delivered = True

    def end(self) -> None:
        """The stream ended; raises when it delivered nothing but failures."""
        if self.run and not self.delivered:
            self._raise(f"all {self.run} records of the run failed")

    def _raise(self, what: str) -> None:
        self.run = 0
        raise DecodeError(f"nothing to yield: {what} to decode and were dropped by "
                          f"{self.policy}; check the files, or use the 'error' policy to see "
                          "the first failure")


class InnerState:
    """The state contract of a loader that runs one inner ``Loader`` for all its epochs.

    ``state_dict()`` / ``load_state_dict()`` / ``set_epoch()`` are the inner loader's (one token
    format for every kind, docs/checkpoint.md), and ``iter()`` refuses a new pass once every
    epoch was delivered, as :meth:`headrace.Loader.__iter__`. The class defines
    ``_state_loader()``.
    """

    def _state_loader(self) -> Loader:
        raise NotImplementedError

    def __iter__(self) -> Self:
        self._state_loader().__iter__()  # raises LoaderError when finished, failed or closed
        return self

    def state_dict(self) -> dict[str, Any]:
        """Where the delivered stream ends, as a JSON-able dict (see ``Loader.state_dict``)."""
        return self._state_loader().state_dict()

    def load_state_dict(self, state: Any) -> None:
        """Continue from ``state`` (a ``state_dict()`` or ``checkpoint()`` token), in place;
        the token's epoch is adopted (see ``Loader.load_state_dict``)."""
        self._state_loader().load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        """Rewind to the start of ``epoch`` (see ``Loader.set_epoch``)."""
        self._state_loader().set_epoch(epoch)

    def _use_budget(self, budget: Any) -> None:
        """Reserve from ``budget`` (a ``headrace.mix`` share), in place: see ``Loader``."""
        self._state_loader()._use_budget(budget)

    def _batch_need(self) -> int:
        """Bytes one batch reserves (``headrace.mix`` sizes a source's share by it)."""
        return self._state_loader()._batch_need()

    def _enable_tune(self) -> None:
        """Autotune the inner loader from now on (``headrace.mix(tune=True)``), in place."""
        self._state_loader()._enable_tune()


class LoaderWrapper(TimelineMixin, ClosingMixin):
    """A loader class that runs inner ``Loader`` objects over data it owns (module docstring).

    Subclasses set ``_closed`` in their constructor and ``_stats_summary``, and define
    ``stats()``, ``_current_loader`` (the inner loader whose report ``print_stats`` shows),
    ``_release_data`` and ``_stop`` (stops the threads).
    """

    _closed: bool
    #: the line ``print_stats`` adds under the inner loader's report: a ``str.format`` template
    #: filled from ``stats()`` by key
    _stats_summary: str

    def _current_loader(self) -> Loader:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    def _release_data(self) -> None:
        """Closes the data (files, records); called once, after the threads have stopped."""
        raise NotImplementedError

    def __iter__(self) -> Self:
        return self

    def print_stats(self) -> None:
        s = self.stats()
        self._current_loader().print_stats()
        print(self._stats_summary.format_map(s))

    def close(self) -> None:
        """Stops the threads and releases the data (idempotent)."""
        if self._closed:
            return
        self._stop()
        self._release_data()


class SingleLoaderWrapper(InnerState, LoaderWrapper):
    """A :class:`LoaderWrapper` whose one ``Loader`` (``_inner``) spans every epoch, over
    :class:`~headrace._sources.media.MediaFiles` (``files``): the audio and video loaders.

    ``_inner`` may be missing when ``close()`` runs (the constructor failed before it was built).
    """

    _inner: Loader
    files: MediaFiles

    def _current_loader(self) -> Loader:
        return self._inner

    def _state_loader(self) -> Loader:
        return self._inner

    def _started(self, timeline_s: float | None, policy: str) -> None:
        """Ends the constructor once ``_inner`` is built: the loader's resolved batch size and
        seed, then the timeline (so its ``t = 0`` is when the loader is ready). ``policy``:
        how the skip/count policy is spelled in the nothing-to-yield error."""
        self._streak = EmptyStreak(self._inner, policy)
        self.batch_size = self._inner.batch_size
        self.seed = self._inner.seed
        self._start_timeline(timeline_s)

    def _stop(self) -> None:
        self._closed = True
        inner = getattr(self, "_inner", None)
        if inner is not None:
            inner.close()

    def _release_data(self) -> None:
        self.files.close()

    def _next_delivered(self, ids_key: str) -> dict[str, Any]:
        """The inner loader's next batch that still holds records (``ids_key``: its id array).

        A batch where every record failed to decode (skip/count policy) comes back empty from
        the transform; it is passed over rather than handed to the training loop.
        """
        streak = self._streak
        while True:
            try:
                b = next(self._inner)
            except StopIteration:
                self._end_timeline()
                streak.end()
                raise
            except LoaderError as e:
                # The Loader wraps what a worker raised; a decode error is the user's to catch
                # by its own type, with the record and path it names.
                if isinstance(e.__cause__, DecodeError):
                    raise e.__cause__.with_traceback(None) from e
                raise
            if len(b[ids_key]) == 0:
                streak.empty(len(self._inner.last_ids))
                continue
            streak.full()
            self.last_ids = b[ids_key]
            self._tick_timeline()
            return b

    def __len__(self) -> int:
        """Batches left to yield (``TypeError`` when endless)."""
        if self._inner._end_epoch is None:
            raise TypeError(f"an endless {self._timeline_kind} loader (epochs=None) has no length")
        return len(self._inner)

    @property
    def classes(self) -> list[str] | None:
        """Class names by label id (folder names or the store's ``_labels.tsv``), or ``None``."""
        return self.files.classes

    @property
    def epoch(self) -> int:
        return self._inner.epoch

    @property
    def loader(self) -> Loader:
        """The underlying :class:`headrace.Loader`."""
        return self._inner

    def checkpoint(self, at: int | None = None) -> bytes:
        """A token for ``resume=``: continues right after the last delivered batch.

        ``at=i``: the token that resumes at delivered batch ``i`` (0-based, counted since this
        loader was built; ``delivered`` is how many it has delivered), for loops that fetch
        ahead: ``checkpoint(at=loader.delivered - 1)`` resumes at the batch fetched but not yet
        trained on. The last 256 batches' tokens are kept.
        """
        return self._inner.checkpoint() if at is None else token_at(self, at)

    @property
    def delivered(self) -> int:
        """Batches this loader has delivered (the index ``checkpoint(at=)`` counts)."""
        return delivered(self)
