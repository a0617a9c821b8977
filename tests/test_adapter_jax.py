"""headrace.jax: real Flax/optax steps on loader output, exact checkpoints, sharding placement."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import headrace
import headrace.jax
from _loader_util import N_CLASSES, N_FEATURES, N_ROWS, make_learnable_store


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_learnable_store(tmp_path_factory.mktemp("jax") / "store")


def host_stream(batches) -> list[dict[str, np.ndarray]]:
    return [{k: np.asarray(v) for k, v in b.items()} for b in batches]


def assert_same_stream(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k in g:
            np.testing.assert_array_equal(g[k], w[k])


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(N_FEATURES, 64, rngs=rngs)
        self.out = nnx.Linear(64, N_CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(nnx.relu(self.hidden(x)))


def test_flax_optax_steps_on_device_batches_reduce_loss(store_path: Path) -> None:
    device = jax.devices()[0]
    sharding = SingleDeviceSharding(device)
    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    # The functional form (split once, jax.jit a pure step) keeps per-step Python overhead small.
    graphdef, state = nnx.split((model, optimizer))

    @jax.jit
    def train_step(state: nnx.State, x: jax.Array, y: jax.Array) -> tuple[nnx.State, jax.Array]:
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model: MLP) -> jax.Array:
            logits = model(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    losses = []
    with headrace.Loader(store_path, batch=100, order="shuffle", seed=1, epochs=None) as loader:
        batches = headrace.jax.iterator(loader, sharding=sharding, prefetch=2)
        for _, batch in zip(range(50), batches, strict=False):
            assert isinstance(batch["x"], jax.Array)
            assert batch["x"].sharding == sharding
            assert batch["x"].shape == (100, N_FEATURES)
            assert batch["x"].dtype == jnp.float32
            # int64 labels arrive as int32 unless jax_enable_x64 is set (JAX's own rule).
            assert batch["label"].dtype in (jnp.int32, jnp.int64)
            state, loss = train_step(state, batch["x"], batch["label"])
            losses.append(float(loss))
        batches.close()
    assert len(losses) == 50
    assert np.mean(losses[-10:]) < 0.3 * np.mean(losses[:5])


@pytest.mark.parametrize("taken", [0, 1, 7, 19, 20])
@pytest.mark.parametrize("order", ["shuffle", "sequential", "iid"])
def test_checkpoint_counts_delivered_not_prefetched(store_path: Path, taken: int,
                                                    order: str) -> None:
    kwargs = {"batch": 100, "order": order, "seed": 3, "epochs": 1}
    with headrace.Loader(store_path, **kwargs) as loader:
        want = host_stream(loader)
    assert len(want) == 20

    with headrace.Loader(store_path, **kwargs) as loader:
        batches = headrace.jax.iterator(loader, prefetch=3)
        head = host_stream(b for _, b in zip(range(taken), batches, strict=False))
        token = batches.checkpoint()
        if 0 < taken < 17:
            # The loader itself has run ahead by the prefetched batches: its own token differs.
            assert loader.checkpoint() != token
        batches.close()
    assert_same_stream(head, want[:taken])

    with headrace.Loader(store_path, resume=token, **kwargs) as resumed:
        rest = host_stream(headrace.jax.iterator(resumed, prefetch=2))
    assert_same_stream(rest, want[taken:])


def test_prefetch_holds_a_bounded_number_of_batches(store_path: Path) -> None:
    with headrace.Loader(store_path, batch=50, order="sequential", epochs=None) as loader:
        pulled = []

        class Counting:
            """Passes the real loader through, counting batches taken from it."""

            def __iter__(self):
                for batch in loader:
                    pulled.append(1)
                    yield batch

            def checkpoint(self) -> bytes:
                return loader.checkpoint()

        batches = headrace.jax.iterator(Counting(), prefetch=2)
        assert pulled == []  # nothing is read before the first next()
        for i in range(5):
            next(batches)
            assert len(pulled) == i + 3  # the one returned + 2 on their way to the device
        batches.close()
        batches.close()  # idempotent
        with pytest.raises(StopIteration):
            next(batches)


def test_prefetch_zero_and_fields_selection(store_path: Path) -> None:
    with headrace.Loader(store_path, batch=64, order="sequential", epochs=1) as loader:
        batches = headrace.jax.iterator(loader, prefetch=0, fields=["label"])
        first = next(batches)
        assert list(first) == ["label"]
        with headrace.open(store_path) as store:
            want = store.gather(np.arange(64))["label"]
        np.testing.assert_array_equal(np.asarray(first["label"]), want)
        np.testing.assert_array_equal(batches.last_ids, np.arange(64))
        total = 64 + sum(int(b["label"].shape[0]) for b in batches)
    assert total == N_ROWS


def test_unknown_field_and_bad_arguments(store_path: Path) -> None:
    with headrace.Loader(store_path, batch=64, epochs=1) as loader:
        with pytest.raises(headrace.ConfigError, match="prefetch"):
            headrace.jax.iterator(loader, prefetch=-1)
        with pytest.raises(headrace.ConfigError, match="fields"):
            headrace.jax.iterator(loader, fields=[])
        with pytest.raises(headrace.ConfigError, match="'nope'"):
            next(headrace.jax.iterator(loader, fields=["nope"]))


def test_worker_error_arrives_after_the_batches_before_it(store_path: Path) -> None:
    def explode_on_batch_3(batch, ids):
        if 150 in ids:
            raise RuntimeError("boom")
        return batch

    with headrace.Loader(store_path, batch=50, order="sequential", epochs=1,
                         transform=explode_on_batch_3) as loader:
        batches = headrace.jax.iterator(loader, prefetch=4)
        got = [next(batches) for _ in range(3)]
        with pytest.raises(headrace.LoaderError) as info:
            next(batches)
        assert 150 in info.value.record_ids
        with pytest.raises(StopIteration):
            next(batches)
    assert [int(b["label"].shape[0]) for b in got] == [50, 50, 50]


def test_ragged_field_on_one_device(tmp_path: Path) -> None:
    with headrace.create(tmp_path / "r", fields={"tokens": "bytes", "label": "int64"}) as writer:
        writer.append({"tokens": [b"a", b"bcd", b"", b"ef"], "label": np.arange(4)})
        writer.commit()
    with headrace.Loader(tmp_path / "r", batch=4, order="sequential", epochs=1) as loader:
        (batch,) = list(headrace.jax.iterator(loader))
    tokens = batch["tokens"]
    assert isinstance(tokens, headrace.Ragged)
    assert isinstance(tokens.values, jax.Array)
    assert bytes(np.asarray(tokens.values)) == b"abcdef"
    np.testing.assert_array_equal(np.asarray(tokens.offsets), [0, 1, 4, 4, 6])


def test_one_device_mesh_named_sharding(store_path: Path) -> None:
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    with headrace.Loader(store_path, batch=32, order="shuffle", seed=0, epochs=None) as loader:
        batch = next(headrace.jax.iterator(loader, sharding=sharding))
    assert batch["x"].sharding == sharding
    assert batch["x"].shape == (32, N_FEATURES)


TWO_DEVICE_SCRIPT = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import headrace, headrace.jax

    store, ragged = sys.argv[1], sys.argv[2]
    assert len(jax.devices()) == 2, jax.devices()
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
    with headrace.Loader(store, batch=64, order="shuffle", seed=5, epochs=None) as loader:
        batches = headrace.jax.iterator(loader, sharding=sharding, prefetch=2)
        batch = next(batches)
        ids = batches.last_ids
    x = batch["x"]
    assert x.sharding == sharding and x.shape == (64, 64)
    assert sorted(s.data.shape for s in x.addressable_shards) == [(32, 64), (32, 64)]
    assert {s.device for s in x.addressable_shards} == set(jax.devices())
    with headrace.open(store) as st:
        host = st.gather(ids)
    np.testing.assert_array_equal(np.asarray(x), host["x"])

    # The multi-process path (make_array_from_process_local_data) also runs in one process.
    with headrace.Loader(store, batch=64, order="shuffle", seed=5, epochs=None) as loader:
        batches = headrace.jax.iterator(loader, sharding=sharding)
        batches._multiprocess = True
        y = next(batches)["x"]
    assert y.sharding == sharding
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))

    # 2,000 rows in batches of 63 cannot split over two devices (63 is odd).
    with headrace.Loader(store, batch=63, order="sequential", epochs=1) as loader:
        try:
            list(headrace.jax.iterator(loader, sharding=sharding))
        except ValueError as exc:
            assert "tail='drop'" in "".join(getattr(exc, "__notes__", [])), exc
        else:
            raise AssertionError("an odd batch split over 2 devices must fail")

    with headrace.Loader(ragged, batch=4, order="sequential", epochs=1) as loader:
        try:
            next(headrace.jax.iterator(loader, sharding=sharding))
        except headrace.ConfigError as exc:
            assert "'tokens' is ragged" in str(exc), exc
        else:
            raise AssertionError("a ragged field cannot be split over devices")
    with headrace.Loader(ragged, batch=4, order="sequential", epochs=1) as loader:
        (batch,) = list(headrace.jax.iterator(loader, sharding=sharding, fields=["label"]))
    assert batch["label"].shape == (4,)
    print("ok")
""")


def test_two_device_mesh_in_a_subprocess(store_path: Path, tmp_path: Path) -> None:
    with headrace.create(tmp_path / "r", fields={"tokens": "bytes", "label": "int64"}) as writer:
        writer.append({"tokens": [b"a", b"bc", b"", b"d"], "label": np.arange(4)})
        writer.commit()
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", TWO_DEVICE_SCRIPT, str(store_path),
                          str(tmp_path / "r")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.strip().endswith("ok")


TWO_PROCESS_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import jax

    rank, port, store = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=rank)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import headrace, headrace.jax

    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
    kwargs = {"order": "shuffle", "seed": 3, "epochs": None}
    with headrace.Loader(store, batch=32, rank=rank, world_size=2, **kwargs) as loader:
        batches = headrace.jax.iterator(loader, sharding=sharding)
        for _ in range(3):
            x = next(batches)["x"]
    assert x.shape == (64, 64) and x.sharding == sharding, (x.shape, x.sharding)
    (local,) = x.addressable_shards
    assert local.index[0] == slice(32 * rank, 32 * rank + 32), local.index
    # The two ranks' batches together are one-process batch 3 of 64, in order (world_size=1:
    # under jax.distributed a loader otherwise reads this process's share).
    with headrace.Loader(store, batch=64, rank=0, world_size=1, **kwargs) as loader:
        for _ in range(3):
            whole = next(loader)["x"]
    np.testing.assert_array_equal(np.asarray(local.data), whole[32 * rank:32 * rank + 32])
    print("ok", rank)
""")


def test_two_processes_build_one_global_array(store_path: Path) -> None:
    with socket.socket() as sock:  # a free port for JAX's coordinator
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, "-c", TWO_PROCESS_SCRIPT, str(rank), str(port),
                               str(store_path)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for rank, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, err[-4000:]
        assert out.strip().endswith(f"ok {rank}")


def test_large_batches_on_cpu_arrive_intact(tmp_path: Path) -> None:
    # Batches past 64 KiB go through the 64-byte-aligned copy that lets XLA:CPU adopt them.
    rng = np.random.default_rng(1)
    x = rng.integers(0, 255, size=(600, 3_000), dtype=np.uint8)
    with headrace.create(tmp_path / "big", fields={
            "x": {"dtype": "uint8", "shape": [3_000]}}) as writer:
        writer.append({"x": x})
        writer.commit()
    with headrace.Loader(tmp_path / "big", batch=256, order="shuffle", seed=2,
                         epochs=1) as loader:
        batches = headrace.jax.iterator(loader, prefetch=1)
        seen = []
        for batch in batches:
            np.testing.assert_array_equal(np.asarray(batch["x"]), x[batches.last_ids])
            seen.append(batches.last_ids)
    assert sorted(np.concatenate(seen).tolist()) == list(range(600))
