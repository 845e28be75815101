"""Tests for loaderkit.transfer: device choice, pin policy, batch moves, prefetching."""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter, OrderedDict, UserList, defaultdict, deque
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset

from loaderkit import IterableReader, ResumableDataLoader, StreamingShardedDataset, transfer
from loaderkit.transfer import (
    DevicePrefetcher,
    move_to_device,
    non_blocking_for,
    pin_batch,
    resolve_pin_memory,
    select_device,
    should_pin_memory,
)
from tests.reliability._cases import read_range
from tests.support.cuda_stub import cuda_prefetcher, stub_cuda

CUDA = torch.cuda.is_available()
META = torch.device("meta")


@pytest.fixture
def no_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        torch.accelerator, "current_accelerator", lambda check_available=False: None
    )


def _fake_accelerator(monkeypatch: pytest.MonkeyPatch, kind: str, count: int = 2) -> None:
    monkeypatch.setattr(
        torch.accelerator,
        "current_accelerator",
        lambda check_available=False: torch.device(kind),
    )
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: count)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_accelerator(monkeypatch, "cuda")


# --- device selection ---------------------------------------------------------------------


def test_select_device_falls_back_to_cpu(no_accelerator: None) -> None:
    assert select_device() == torch.device("cpu")
    assert select_device("cpu") == torch.device("cpu")
    assert select_device(torch.device("cpu")) == torch.device("cpu")
    assert select_device("cpu:0") == torch.device("cpu")


def test_select_device_picks_current_accelerator(fake_cuda: None) -> None:
    assert select_device() == torch.device("cuda", 0)
    assert select_device("cuda") == torch.device("cuda", 0)
    assert select_device("cuda:1") == torch.device("cuda", 1)
    assert select_device(1) == torch.device("cuda", 1)
    assert select_device(torch.device("cuda", 1)) == torch.device("cuda", 1)


def test_select_device_without_accelerator_is_cpu_for_real() -> None:
    if torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator")
    assert select_device() == torch.device("cpu")


@pytest.mark.parametrize(
    ("device", "error", "match"),
    [
        ("cuda", ValueError, r"select_device: device 'cuda' is not available \(no accelerator"),
        ("cuda:1", ValueError, r"device 'cuda:1' is not available.*pass device=None"),
        ("gpu", ValueError, r"device 'gpu' is not a valid device string; pass e\.g\. 'cpu'"),
        ("cuda:x", ValueError, r"not a valid device string"),
        (1.5, TypeError, r"device must be a torch\.device, a str.*got 1\.5 \(float\)"),
        (True, TypeError, r"got True \(bool\)"),
        (-1, ValueError, r"device index must be >= 0, got -1"),
    ],
)
def test_select_device_rejects_bad_values(
    no_accelerator: None, device: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        select_device(device)


def test_select_device_rejects_other_accelerator_and_bad_index(fake_cuda: None) -> None:
    with pytest.raises(ValueError, match=r"'mps' is not available \(only 'cuda' is available"):
        select_device("mps")
    with pytest.raises(ValueError, match=r"'cuda:2' is out of range: 2 cuda device\(s\).*\[0, 2\)"):
        select_device("cuda:2")


# --- pin policy ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "mps", "cuda", "cuda:0", "xpu", torch.device("cpu")])
def test_should_pin_memory_false_without_accelerator(no_accelerator: None, device: Any) -> None:
    assert should_pin_memory(device) is False


def test_should_pin_memory_only_for_available_cuda(fake_cuda: None) -> None:
    assert should_pin_memory("cuda") is True
    assert should_pin_memory(torch.device("cuda", 1)) is True
    assert should_pin_memory("cpu") is False
    assert should_pin_memory("mps") is False
    assert should_pin_memory("xpu") is False  # pinnable type, but not the available one


def test_should_pin_memory_never_for_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_accelerator(monkeypatch, "mps", count=1)
    assert should_pin_memory("mps") is False


def test_should_pin_memory_for_available_xpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_accelerator(monkeypatch, "xpu", count=1)
    assert should_pin_memory("xpu") is True


def test_should_pin_memory_validates(no_accelerator: None) -> None:
    with pytest.raises(ValueError, match=r"should_pin_memory: device 'gpu' is not a valid"):
        should_pin_memory("gpu")


def test_resolve_pin_memory_auto_and_false(no_accelerator: None) -> None:
    assert resolve_pin_memory("auto", "cpu") is False
    assert resolve_pin_memory("auto", "cuda") is False
    assert resolve_pin_memory(False, "cuda") is False


def test_resolve_pin_memory_auto_with_cuda(fake_cuda: None) -> None:
    assert resolve_pin_memory("auto", "cuda") is True
    assert resolve_pin_memory("auto", "cpu") is False
    assert resolve_pin_memory(True, "cuda:0") is True
    assert resolve_pin_memory(False, "cuda") is False


def test_resolve_pin_memory_true_where_useless_warns(no_accelerator: None) -> None:
    with pytest.warns(UserWarning, match=r"pin_memory=True has no effect for device 'cuda'"):
        assert resolve_pin_memory(True, "cuda") is False


def test_resolve_pin_memory_true_for_cpu_target_warns(fake_cuda: None) -> None:
    with pytest.warns(UserWarning, match=r"no effect for device 'cpu'.*pin_memory='auto'"):
        assert resolve_pin_memory(True, "cpu") is False


def test_a_loader_decides_pinning_without_starting_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    # Asking CUDA's runtime (is_available, the device index) starts CUDA: a process forked
    # after that cannot use CUDA, and a loader built in one raised. NVML's count does not.
    def starts_cuda(*args: Any) -> Any:
        raise AssertionError("this call starts CUDA")

    if torch.version.cuda is None or torch.cuda.is_initialized():
        pytest.skip("needs a CUDA build of torch that has not started CUDA in this process")
    monkeypatch.setattr(torch.cuda, "is_available", starts_cuda)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", starts_cuda)
    monkeypatch.setattr(torch.accelerator, "current_device_index", starts_cuda)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 1)  # NVML sees a GPU
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pin_memory=True resolves to pinning: no warning
        ResumableDataLoader(list(range(8)), batch_size=2, num_workers=2, pin_memory=True)
    assert transfer.default_device() == torch.device("cuda")
    assert should_pin_memory("cuda") is True


class EightInts(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(8))


@pytest.mark.parametrize(
    ("kind", "workers"), [("map", 0), ("map", 2), ("iterable", 0), ("stream", 0)]
)
def test_pinning_waits_for_the_runtime_to_confirm_the_device(
    monkeypatch: pytest.MonkeyPatch, kind: str, workers: int
) -> None:
    # NVML can count a GPU that CUDA cannot use (a driver too old for this torch): "auto"
    # then does not pin, as before, instead of failing at the first batch.
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda **_: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 1)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    dataset: Any = {
        "map": list(range(8)),
        "iterable": EightInts(),
        "stream": StreamingShardedDataset([(0, 4), (4, 4)], IterableReader(read_range)),
    }[kind]
    loader = ResumableDataLoader(dataset, batch_size=2, num_workers=workers, pin_memory="auto")
    assert loader.pin_memory is True  # decided at construction: NVML counts a GPU
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "no accelerator is found" for workers
        batches = list(loader)
    assert sorted(i for b in batches for i in b.tolist()) == list(range(8))
    assert not any(b.is_pinned() for b in batches)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_resolve_pin_memory_rejects_bad_values(value: Any) -> None:
    with pytest.raises(TypeError, match=r"pin_memory must be True, False or 'auto', got"):
        resolve_pin_memory(value, "cpu")


# --- non_blocking policy ------------------------------------------------------------------


@pytest.fixture
def pinned_looking(monkeypatch: pytest.MonkeyPatch) -> torch.Tensor:
    tensor = torch.ones(3)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: self is tensor)
    return tensor


CUDA_DEVICE = torch.device("cuda", 0)


def test_non_blocking_auto_only_for_pinned_host_to_cuda(pinned_looking: torch.Tensor) -> None:
    pageable = torch.ones(3)
    assert non_blocking_for(pinned_looking, CUDA_DEVICE) is True
    assert non_blocking_for(pinned_looking, torch.device("xpu")) is True
    assert non_blocking_for(pageable, CUDA_DEVICE) is False
    assert non_blocking_for(pinned_looking, torch.device("cpu")) is False
    assert non_blocking_for(pinned_looking, torch.device("mps")) is False
    assert non_blocking_for(pinned_looking, META) is False
    assert non_blocking_for(torch.ones(3, device=META), CUDA_DEVICE) is False
    assert non_blocking_for(pinned_looking, "cuda:0") is True
    with pytest.raises(ValueError, match=r"non_blocking_for: device 'gpu' is not a valid"):
        non_blocking_for(pinned_looking, "gpu")


def test_non_blocking_explicit_is_respected_only_where_safe(
    pinned_looking: torch.Tensor,
) -> None:
    pageable = torch.ones(3)
    assert non_blocking_for(pageable, CUDA_DEVICE, True) is True  # safe, if pointless
    assert non_blocking_for(pinned_looking, CUDA_DEVICE, False) is False
    assert non_blocking_for(pinned_looking, torch.device("cpu"), True) is False  # D2H race
    assert non_blocking_for(pinned_looking, torch.device("mps"), True) is False
    assert non_blocking_for(pageable, META, True) is True


# --- move_to_device / pin_batch: containers -----------------------------------------------


class Pair(NamedTuple):
    x: torch.Tensor
    label: str


@dataclass
class Sample:
    x: torch.Tensor
    ids: list[torch.Tensor]
    name: str = "s"
    derived: int = field(default=0, init=False)


@dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    n: int


@dataclass
class Checked:
    x: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.device.type != "cpu":
            raise AssertionError("__post_init__ must not run again")


class CustomBatch:
    """A user batch type with its own ``.to()`` and ``.pin_memory()``."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self.to_calls: list[tuple[Any, dict[str, Any]]] = []
        self.pinned = False

    def to(self, device: Any, non_blocking: bool = False) -> CustomBatch:
        moved = CustomBatch(self.x.to(device))
        moved.to_calls = [*self.to_calls, (device, {"non_blocking": non_blocking})]
        return moved

    def pin_memory(self) -> CustomBatch:
        pinned = CustomBatch(self.x)
        pinned.pinned = True
        return pinned


class PlainTo:
    """``.to(device)`` without a non_blocking parameter."""

    def __init__(self) -> None:
        self.devices: list[Any] = []

    def to(self, device: Any) -> PlainTo:
        self.devices.append(device)
        return self


class MyDict(dict[str, Any]):
    pass


class MyList(list[Any]):
    pass


class _Store(MutableMapping[str, Any]):
    def __init__(self, data: dict[str, Any]) -> None:
        self._d = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._d[key] = value

    def __delitem__(self, key: str) -> None:
        del self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


def test_move_recurses_through_every_container_kind() -> None:
    array = np.arange(3)
    inner: defaultdict[str, Any] = defaultdict(list, {"t": torch.ones(1)})
    batch: dict[str, Any] = {
        "tensor": torch.ones(2),
        "nested": {"deep": {"t": torch.zeros(2), "n": 7}},
        "list": [torch.ones(1), "text", None],
        "tuple": (torch.ones(1), 3.5),
        "pair": Pair(torch.ones(1), "label"),
        "sample": Sample(torch.ones(1), [torch.ones(1)]),
        "frozen": Frozen(torch.ones(1), 4),
        "checked": Checked(torch.ones(1)),
        "ordered": OrderedDict([("b", torch.ones(1)), ("a", torch.ones(1))]),
        "default": inner,
        "mine": MyDict(t=torch.ones(1)),
        "mylist": MyList([torch.ones(1)]),
        "proxy": MappingProxyType({"t": torch.ones(1)}),
        "counter": Counter({"t": torch.ones(1), "n": 2}),  # update() would add: doubled
        "size": torch.Size([2, 3]),
        "array": array,
        "custom": CustomBatch(torch.ones(1)),
    }
    moved = move_to_device(batch, META)

    assert moved["tensor"].device == META
    assert moved["nested"]["deep"]["t"].device == META and moved["nested"]["deep"]["n"] == 7
    assert moved["list"][0].device == META and moved["list"][1:] == ["text", None]
    assert type(moved["tuple"]) is tuple and moved["tuple"][0].device == META
    assert type(moved["pair"]) is Pair and moved["pair"].x.device == META
    assert moved["pair"].label == "label"
    sample = moved["sample"]
    assert type(sample) is Sample and sample.x.device == META and sample.ids[0].device == META
    assert sample.name == "s"
    assert type(moved["frozen"]) is Frozen and moved["frozen"].x.device == META
    assert moved["checked"].x.device == META
    assert type(moved["ordered"]) is OrderedDict and list(moved["ordered"]) == ["b", "a"]
    assert type(moved["default"]) is defaultdict and moved["default"].default_factory is list
    assert moved["default"]["t"].device == META
    assert type(moved["mine"]) is MyDict and moved["mine"]["t"].device == META
    assert type(moved["mylist"]) is MyList and moved["mylist"][0].device == META
    assert type(moved["proxy"]) is MappingProxyType and moved["proxy"]["t"].device == META
    assert type(moved["counter"]) is Counter and moved["counter"]["n"] == 2
    tagged = MyList([torch.ones(1)])
    tagged.tag = "mine"  # type: ignore[attr-defined]
    assert move_to_device(tagged, META).tag == "mine"  # a list subclass keeps its attributes
    shared = _Store({"t": torch.ones(1)})  # copy.copy would share its storage
    assert move_to_device(shared, META)["t"].device == META and shared["t"].device != META
    assert move_to_device(UserList([torch.ones(1)]), META)[0].device == META
    # Hunter 336: a deque's tensors stayed put; a Mapping that cannot be rebuilt became a dict.
    queued = move_to_device(deque([torch.ones(1)], maxlen=3), META)
    assert type(queued) is deque and queued.maxlen == 3 and queued[0].device == META
    assert moved["size"] == torch.Size([2, 3])
    assert moved["array"] is array
    assert moved["custom"].x.device == META
    assert moved["custom"].to_calls == [(META, {"non_blocking": False})]
    # The input is not modified.
    assert batch["tensor"].device.type == "cpu" and inner["t"].device.type == "cpu"
    assert batch["sample"].x.device.type == "cpu"


class _Keywords(Mapping[str, Any]):
    def __init__(self, **kw: Any) -> None:
        self._d = kw

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


def test_a_container_that_cannot_be_rebuilt_is_refused_not_replaced() -> None:
    with pytest.raises(TypeError, match=r"a _Keywords cannot be rebuilt from its moved items"):
        move_to_device(_Keywords(t=torch.ones(1)), META)
    untouched = _Keywords(name="x")  # nothing moved: kept as it is
    assert move_to_device(untouched, META) is untouched


def test_move_dataclass_keeps_init_false_fields() -> None:
    sample = Sample(torch.ones(1), [])
    sample.derived = 5
    assert move_to_device(sample, META).derived == 5


@dataclass
class Lazy:
    x: torch.Tensor
    cache: torch.Tensor = field(init=False, repr=False)  # filled later, may be unset


def test_move_skips_an_unset_init_false_field() -> None:
    moved = move_to_device(Lazy(torch.ones(2)), META)
    assert moved.x.device == META and not hasattr(moved, "cache")


def test_move_leaves_non_tensors_alone() -> None:
    for leaf in [1, 2.5, "s", b"b", None, np.ones(2), {1, 2}, Sample]:
        assert move_to_device(leaf, META) is leaf


def test_move_to_device_validates_arguments() -> None:
    with pytest.raises(ValueError, match=r"move_to_device: device 'gpu' is not a valid"):
        move_to_device(torch.ones(1), "gpu")
    with pytest.raises(TypeError, match=r"non_blocking must be None, True or False, got 'yes'"):
        move_to_device(torch.ones(1), "cpu", non_blocking="yes")  # type: ignore[arg-type]


def test_move_passes_the_non_blocking_decision(
    monkeypatch: pytest.MonkeyPatch, pinned_looking: torch.Tensor
) -> None:
    seen: list[tuple[str, bool]] = []

    def fake_to(self: torch.Tensor, device: torch.device, non_blocking: bool = False) -> Any:
        seen.append(("pinned" if self is pinned_looking else "pageable", non_blocking))
        return self

    monkeypatch.setattr(torch.Tensor, "to", fake_to)
    # The tensors never reach a device here: let "cuda" count as available.
    monkeypatch.setattr(transfer, "_unavailable", lambda target: None)
    batch = [pinned_looking, torch.ones(1)]
    move_to_device(batch, "cuda")
    move_to_device(batch, "cuda", non_blocking=False)
    move_to_device(batch, "cuda", non_blocking=True)
    move_to_device(batch, "cpu", non_blocking=True)
    assert seen == [
        ("pinned", True),
        ("pageable", False),
        ("pinned", False),
        ("pageable", False),
        ("pinned", True),
        ("pageable", True),
        ("pinned", False),
        ("pageable", False),
    ]


def test_move_custom_types_get_non_blocking_only_when_explicit_safe_and_accepted() -> None:
    custom, plain = CustomBatch(torch.ones(1)), PlainTo()
    assert move_to_device(custom, META, non_blocking=True).to_calls == [
        (META, {"non_blocking": True})
    ]
    assert move_to_device(custom, META).to_calls == [(META, {"non_blocking": False})]
    cpu = torch.device("cpu")
    assert move_to_device(custom, cpu, non_blocking=True).to_calls == [
        (cpu, {"non_blocking": False})
    ]
    move_to_device(plain, META, non_blocking=True)
    assert plain.devices == [META]


@pytest.fixture
def fake_pinning(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Pretend pinning works on this CPU-only machine; returns the pinned copies."""
    pinned: list[torch.Tensor] = []

    def fake_pin(self: torch.Tensor) -> torch.Tensor:
        copy = self.clone()
        pinned.append(copy)
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: any(self is p for p in pinned))
    # pin_batch checks that a pinning accelerator exists before it pins anything.
    real = transfer._available_accelerator
    monkeypatch.setattr(
        transfer, "_available_accelerator", lambda: real() or torch.device("cuda", 0)
    )
    return pinned


def test_pin_batch_pins_cpu_tensors_and_custom_types(fake_pinning: list[torch.Tensor]) -> None:
    array = np.ones(2)
    batch: dict[str, Any] = {
        "x": torch.arange(3),
        "pair": Pair(torch.ones(1), "l"),
        "sample": Sample(torch.ones(2), [torch.zeros(1)]),
        "meta": torch.ones(1, device=META),
        "custom": CustomBatch(torch.ones(1)),
        "plain": PlainTo(),
        "array": array,
        "n": 3,
    }
    out = pin_batch(batch)
    assert len(fake_pinning) == 4  # x, pair.x, sample.x, sample.ids[0]
    assert out["x"] is fake_pinning[0] and torch.equal(out["x"], batch["x"])
    assert type(out["pair"]) is Pair and out["pair"].x is fake_pinning[1]
    assert out["sample"].ids[0] is fake_pinning[3]
    assert out["meta"] is batch["meta"]
    assert out["custom"].pinned is True
    assert out["plain"] is batch["plain"] and out["array"] is array and out["n"] == 3
    again = pin_batch(out)  # already pinned: no new copies
    assert len(fake_pinning) == 4 and again["x"] is out["x"]


# --- DevicePrefetcher on CPU --------------------------------------------------------------


class CountingIterable:
    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.iter_calls = 0

    def __iter__(self) -> Iterator[Any]:
        self.iter_calls += 1
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def test_prefetcher_cpu_is_a_pass_through(no_accelerator: None) -> None:
    batches = [{"x": torch.full((2,), float(i)), "i": i} for i in range(5)]
    source = CountingIterable(batches)
    prefetcher = DevicePrefetcher(source, "cpu")
    assert prefetcher.device == torch.device("cpu") and prefetcher.pin_memory is False
    assert len(prefetcher) == 5
    first = list(prefetcher)
    assert all(a is b for a, b in zip(first, batches, strict=True))
    assert [b["i"] for b in prefetcher] == [0, 1, 2, 3, 4]
    assert source.iter_calls == 2  # a fresh iter(iterable) per iter()
    assert DevicePrefetcher(source).device == torch.device("cpu")


def test_prefetcher_without_length(no_accelerator: None) -> None:
    prefetcher = DevicePrefetcher((torch.ones(1) for _ in range(2)), "cpu")
    with pytest.raises(TypeError, match=r"wrapped generator has no length"):
        len(prefetcher)
    assert len(list(prefetcher)) == 2


def test_prefetcher_state_needs_a_stateful_iterable(no_accelerator: None) -> None:
    prefetcher = DevicePrefetcher(CountingIterable([]), "cpu")
    with pytest.raises(TypeError, match=r"state_dict: the wrapped CountingIterable has no"):
        prefetcher.state_dict()
    with pytest.raises(TypeError, match=r"load_state_dict: .* wrap a stateful loader"):
        prefetcher.load_state_dict({})
    assert repr(prefetcher) == "DevicePrefetcher(CountingIterable, device='cpu', pin_memory=False)"


@pytest.fixture
def stubbed_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    stub_cuda(monkeypatch)


@pytest.mark.parametrize("save", ["loader", "prefetcher"])
def test_prefetcher_look_ahead_does_not_leak_into_the_saved_state(
    stubbed_cuda: None, save: str
) -> None:
    # Measured: the loader's state_dict() under a CUDA prefetcher was one batch ahead,
    # so a resume skipped a batch.
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(list(range(40)), batch_size=4, shuffle=True, seed=3)

    reference = [b.tolist() for b in loader()]
    source = loader()
    prefetcher = cuda_prefetcher(source)
    seen = []
    for batch in prefetcher:
        seen.append(batch.tolist())
        if len(seen) == 3:
            state = (source if save == "loader" else prefetcher).state_dict()
            break
    assert state["position"] == 12  # 3 batches of 4 consumed, not 4
    resumed = loader()
    resumed.load_state_dict(state)
    assert seen + [b.tolist() for b in resumed] == reference


class _LiveState(torch.utils.data.IterableDataset):
    """Counts in a dict and hands that very dict out as its state."""

    def __init__(self) -> None:
        self.state = {"i": 0}

    def __iter__(self) -> Iterator[int]:
        while self.state["i"] < 12:
            self.state["i"] += 1
            yield self.state["i"] - 1

    def state_dict(self) -> dict[str, int]:
        return self.state

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = dict(state)


def test_a_state_the_look_ahead_moves_on_is_held_as_it_was(stubbed_cuda: None) -> None:
    # Measured: torchdata passes the dataset's state object through, and the held copy was
    # shallow, so the look-ahead advanced it: the resume skipped [6, 7].
    from torchdata.stateful_dataloader import StatefulDataLoader

    prefetcher = cuda_prefetcher(StatefulDataLoader(_LiveState(), batch_size=2))
    it = iter(prefetcher)
    seen = [next(it).tolist() for _ in range(3)]
    resumed = StatefulDataLoader(_LiveState(), batch_size=2)
    resumed.load_state_dict(prefetcher.state_dict())
    assert seen + [b.tolist() for b in resumed] == [[i, i + 1] for i in range(0, 12, 2)]


@pytest.mark.parametrize("stop", ["break", "raise"])
def test_a_loop_that_stops_early_saves_what_it_consumed(stubbed_cuda: None, stop: str) -> None:
    # The held state was dropped with the loop's iterator (a prefetcher made in the for
    # statement goes with it): saved after the loop, it counted the look-ahead batch.
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(list(range(20)), batch_size=2, shuffle=True, seed=1)

    reference = [b.tolist() for b in loader()]
    source, seen = loader(), []
    with contextlib.suppress(RuntimeError):
        for batch in cuda_prefetcher(source):
            seen.append(batch.tolist())
            if len(seen) == 3 and stop == "break":
                break
            if len(seen) == 3:
                raise RuntimeError("the step fails")
    state = source.state_dict()
    assert state["position"] == 6
    resumed = loader()
    resumed.load_state_dict(state)
    assert seen + [b.tolist() for b in resumed] == reference


def test_a_finished_prefetcher_no_longer_answers_for_the_loader(stubbed_cuda: None) -> None:
    from loaderkit import ResumableDataLoader

    source = ResumableDataLoader(list(range(8)), batch_size=4)
    prefetcher = cuda_prefetcher(source)
    assert len(list(prefetcher)) == 2
    assert prefetcher.held_state() is None
    it = iter(source)  # a plain iteration after it: the loader's own state
    next(it)
    assert source.state_dict()["position"] == 4


class _MissingKey(torch.utils.data.Dataset[int]):
    """Ten samples; sample 3 raises KeyError (a record missing from its store)."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> int:
        if index == 3:
            raise KeyError(f"record {index}")
        return index


def _catching_loop(it: Any, stop: int | None = None) -> list[Any]:
    seen: list[Any] = []
    while stop is None or len(seen) < stop:
        try:
            seen.append(next(it).tolist())
        except StopIteration:
            break
        except KeyError:
            seen.append("KeyError")
    return seen


@pytest.mark.parametrize("path", ["cuda", "moved"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_failed_batch_through_the_prefetcher_is_raised_and_the_epoch_goes_on(
    stubbed_cuda: None, monkeypatch: pytest.MonkeyPatch, path: str, num_workers: int
) -> None:
    # Review of issue 21: the CUDA path gave only the KeyError (batch [0, 1] lost but
    # counted in the state); the other accelerators' path ended the epoch at the error.
    from loaderkit import ResumableDataLoader

    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(_MissingKey(), batch_size=2, num_workers=num_workers, seed=0)

    want = [[0, 1], "KeyError", [4, 5], [6, 7], [8, 9]]
    assert _catching_loop(iter(torch.utils.data.DataLoader(_MissingKey(), batch_size=2))) == want
    device = torch.device("cuda", 0) if path == "cuda" else torch.device("xpu", 0)

    def prefetched(source: Any) -> DevicePrefetcher:
        prefetcher = DevicePrefetcher(source, "cpu")
        prefetcher.device = device
        return prefetcher

    if path == "moved":
        monkeypatch.setattr(transfer, "move_to_device", lambda batch, device: batch)
    assert _catching_loop(iter(prefetched(loader()))) == want
    for cut in (1, 2, 3):  # the state as the consumer saw it, the error included
        source = loader()
        it = iter(prefetched(source))
        head = _catching_loop(it, cut)
        state = source.state_dict()
        del it
        resumed = loader()
        resumed.load_state_dict(state)
        assert head + _catching_loop(iter(resumed)) == want, cut


def test_prefetcher_validates(no_accelerator: None) -> None:
    with pytest.raises(TypeError, match=r"DevicePrefetcher: iterable must be iterable.*int"):
        DevicePrefetcher(3, "cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"device 'cuda' is not available"):
        DevicePrefetcher([], "cuda")
    with pytest.raises(TypeError, match=r"pin_memory must be True, False or 'auto'"):
        DevicePrefetcher([], "cpu", pin_memory="always")  # type: ignore[arg-type]
    with pytest.warns(UserWarning, match=r"pin_memory=True has no effect"):
        assert DevicePrefetcher([], "cpu", pin_memory=True).pin_memory is False


def test_prefetcher_moves_to_other_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_accelerator(monkeypatch, "meta", count=1)
    batches = [(torch.ones(2), i) for i in range(3)]
    prefetcher = DevicePrefetcher(batches, "meta")
    out = list(prefetcher)
    assert [i for _, i in out] == [0, 1, 2]
    assert all(x.device.type == "meta" for x, _ in out)


class _FakeStream:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: _FakeStream) -> None:
        self.log.append(f"{self.name} waits {other.name}")


def test_prefetcher_cuda_protocol_with_fake_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path's ordering, checked on CPU: copy n+1 is issued before batch n is
    handed over, the consumer waits for the side stream first, every handed tensor is
    record_stream-ed on the consumer stream, and copies run inside the side stream."""
    log: list[str] = []
    side, consumer = _FakeStream("side", log), _FakeStream("consumer", log)
    active: list[str] = []

    class StreamContext:
        def __init__(self, stream: _FakeStream) -> None:
            self.stream = stream

        def __enter__(self) -> None:
            active.append(self.stream.name)

        def __exit__(self, *exc: object) -> None:
            active.pop()

    def fake_move(batch: Any, device: Any, non_blocking: bool | None = None) -> Any:
        log.append(f"copy {batch['i']} on {active[-1] if active else 'default'}")
        return batch

    def fake_record(batch: Any, stream: _FakeStream) -> None:
        log.append(f"record {batch['i']} on {stream.name}")

    monkeypatch.setattr(torch.cuda, "Stream", lambda device: side)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: consumer)
    monkeypatch.setattr(torch.cuda, "stream", StreamContext)
    monkeypatch.setattr(transfer, "move_to_device", fake_move)
    monkeypatch.setattr(transfer, "_record_stream", fake_record)

    prefetcher = DevicePrefetcher([{"i": 0}, {"i": 1}], "cpu")
    prefetcher.device = torch.device("cuda", 0)  # the CUDA path, without CUDA
    out = []
    for batch in prefetcher._cuda_batches():
        log.append(f"consume {batch['i']}")
        out.append(batch["i"])
    assert out == [0, 1]
    assert log == [
        "side waits consumer",
        "copy 0 on side",
        "consumer waits side",
        "record 0 on consumer",
        "side waits consumer",
        "copy 1 on side",
        "consume 0",
        "consumer waits side",
        "record 1 on consumer",
        "consume 1",
    ]


def test_record_stream_reaches_every_cuda_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded: list[str] = []
    monkeypatch.setattr(
        torch.Tensor, "record_stream", lambda self, stream: recorded.append("tensor")
    )

    class WithRecord:
        def record_stream(self, stream: Any) -> None:
            recorded.append("custom")

    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: CUDA_DEVICE))
    transfer._record_stream(
        {"a": torch.ones(1), "b": [Sample(torch.ones(1), [torch.ones(1)])], "c": WithRecord()},
        "stream",  # type: ignore[arg-type]
    )
    assert sorted(recorded) == ["custom", "tensor", "tensor", "tensor"]


# --- GPU ------------------------------------------------------------------------------------


@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_move_lands_on_cuda_with_equal_values(pinned: bool) -> None:
    batch: dict[str, Any] = {
        "x": torch.randn(256, 256),
        "pair": Pair(torch.arange(10), "l"),
        "n": 1,
    }
    source = pin_batch(batch) if pinned else batch
    if pinned:
        assert source["x"].is_pinned() and source["pair"].x.is_pinned()
        assert non_blocking_for(source["x"], torch.device("cuda")) is True
    moved = move_to_device(source, "cuda")
    assert moved["x"].is_cuda and moved["pair"].x.is_cuda and moved["n"] == 1
    assert torch.equal(moved["x"].cpu(), batch["x"])
    assert torch.equal(moved["pair"].x.cpu(), batch["pair"].x)
    back = move_to_device(moved, "cpu", non_blocking=True)  # downgraded: safe to read at once
    assert torch.equal(back["x"], batch["x"])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_pinned_tensors_are_copied_non_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    flags: list[bool] = []
    original = torch.Tensor.to

    def spy(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        flags.append(bool(kwargs.get("non_blocking", False)))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    move_to_device([torch.ones(4).pin_memory(), torch.ones(4)], "cuda")
    assert flags == [True, False]


def _heavy(work: torch.Tensor, steps: int = 20) -> torch.Tensor:
    for _ in range(steps):
        work = torch.tanh(work @ work)
    return work


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("pin_memory", ["auto", False])
def test_gpu_prefetcher_reads_at_once_get_the_right_batches(pin_memory: Any) -> None:
    # Large batches and an immediate read on an idle consumer stream: without the
    # consumer waiting on the side stream, reads would overtake the copies.
    batches = [{"x": torch.full((4096, 1024), float(i)), "i": i} for i in range(12)]
    prefetcher = DevicePrefetcher(batches, "cuda", pin_memory=pin_memory)
    torch.cuda.synchronize()
    clones, indices = [], []
    for batch in prefetcher:
        assert batch["x"].is_cuda
        clones.append(batch["x"][::512, ::128].clone())
        indices.append(batch["i"])
    torch.cuda.synchronize()
    assert indices == list(range(12))
    for i, clone in enumerate(clones):
        assert torch.all(clone == float(i)), f"batch {i} read before its copy finished"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_prefetcher_memory_is_not_reused_while_in_use() -> None:
    # The consumer queues heavy work, then a read and an in-place update of the
    # batch, and drops it at once: if the allocator handed its memory to the next
    # copy before those kernels ran, they would see the next batch's values.
    device = torch.device("cuda")
    work = torch.randn(1024, 1024, device=device) / 32
    batches = [torch.full((2048, 1024), float(i)) for i in range(30)]
    results = []
    for batch in DevicePrefetcher(batches, device):
        _heavy(work)
        batch.add_(1)
        results.append(batch[::256, ::256].clone())
        del batch
    torch.cuda.synchronize()
    for i, result in enumerate(results):
        assert torch.all(result == float(i + 1)), f"batch {i} was overwritten"
    assert all(torch.all(b == float(i)) for i, b in enumerate(batches))  # sources untouched


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_prefetcher_many_mixed_batches_with_compute() -> None:
    device = torch.device("cuda")
    work = torch.randn(512, 512, device=device) / 16
    batches: list[dict[str, Any]] = [
        {
            "x": torch.randn(64, 512),
            "pair": Pair(torch.arange(i, i + 8), "l"),
            "custom": Sample(torch.full((3,), float(i)), [torch.tensor([i])]),
        }
        for i in range(100)
    ]
    prefetcher = DevicePrefetcher(batches, device)
    assert len(prefetcher) == 100
    for _epoch in range(2):
        seen = 0
        for i, batch in enumerate(prefetcher):
            out = _heavy(work, steps=4) + batch["x"].sum()
            assert torch.isfinite(out).all()
            assert torch.equal(batch["x"].cpu(), batches[i]["x"])
            assert torch.equal(batch["pair"].x.cpu(), batches[i]["pair"].x)
            assert batch["custom"].x.is_cuda and batch["custom"].ids[0].item() == i
            seen += 1
        assert seen == 100


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_prefetcher_respects_consumer_stream() -> None:
    device = torch.device("cuda")
    batches = [torch.full((1024, 1024), float(i)) for i in range(8)]
    other = torch.cuda.Stream(device=device)
    sums = []
    with torch.cuda.stream(other):
        for batch in DevicePrefetcher(batches, device):
            sums.append(batch.sum())
    torch.cuda.synchronize()
    assert [s.item() for s in sums] == [float(i) * 1024 * 1024 for i in range(8)]


def test_a_stopped_prefetchers_state_follows_the_loader_once_it_moves_on(
    stubbed_cuda: None,
) -> None:
    source = ResumableDataLoader(list(range(20)), batch_size=2, shuffle=True, seed=1)
    prefetcher = cuda_prefetcher(source)
    for seen, _ in enumerate(prefetcher, 1):
        if seen == 3:
            break
    assert prefetcher.state_dict()["position"] == source.state_dict()["position"] == 6
    source.set_epoch(1)  # a state saved now starts epoch 1 (it held epoch 0's position 6)
    assert (source.state_dict()["epoch"], source.state_dict()["position"]) == (1, 0)
    assert prefetcher.state_dict() == source.state_dict()
    it = iter(source)
    next(it), next(it)
    assert prefetcher.state_dict()["position"] == source.state_dict()["position"] == 4


def test_a_first_copy_that_fails_loses_no_batch(
    stubbed_cuda: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(batch: Any, device: Any) -> Any:
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(transfer, "move_to_device", failing)
    source = ResumableDataLoader(list(range(20)), batch_size=2, shuffle=True, seed=1)
    with pytest.raises(RuntimeError, match="out of memory"):
        next(iter(cuda_prefetcher(source)))
    assert source.state_dict()["position"] == 0


def test_a_set_epoch_of_the_running_epoch_inside_the_loop_keeps_the_consumers_view(
    stubbed_cuda: None,
) -> None:
    # set_epoch dropped the holder: the loader's state then counted the batch copied ahead.
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(list(range(20)), batch_size=2, shuffle=True, seed=1)

    reference = [b.tolist() for b in loader()]
    source, seen = loader(), []
    for batch in cuda_prefetcher(source):
        source.set_epoch(0)
        seen.append(batch.tolist())
        if len(seen) == 3:
            state = source.state_dict()
            break
    resumed = loader()
    resumed.load_state_dict(state)
    assert state["position"] == 6 and seen + [b.tolist() for b in resumed] == reference


@pytest.mark.parametrize("named", [False, True], ids=["iter", "set_epoch"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stream_going_on_across_epochs_keeps_the_batch_copied_ahead_of_a_stopped_loop(
    stubbed_cuda: None, num_workers: int, named: bool
) -> None:
    # The next epoch went on after the look-ahead batch: it was drawn, never handed out, and
    # lost (the state saved at the break had it unconsumed, so a resume yielded it).
    def loader() -> ResumableDataLoader:
        shards = [(0, 8), (10, 10), (20, 8), (30, 10)]
        data = StreamingShardedDataset(shards, IterableReader(read_range), steps_per_epoch=4)
        return ResumableDataLoader(data, batch_size=2, seed=3, num_workers=num_workers)

    def stopped(prefetch: bool) -> list[list[int]]:
        source = loader()
        batches = cuda_prefetcher(source) if prefetch else source
        seen = []
        for batch in batches:
            seen.append(batch.tolist())
            if len(seen) == 2:
                break
        if named:  # as a loop over a DistributedSampler names each epoch
            source.set_epoch(1)
        return seen + [b.tolist() for b in batches]

    assert stopped(prefetch=True) == stopped(prefetch=False)


def test_persistent_workers_behind_a_prefetcher_stopped_at_len_are_kept(
    stubbed_cuda: None,
) -> None:
    # As Lightning stops: at len(), the look-ahead having met the epoch's end, nothing to take
    # back; taking it back anyway restarted the workers every epoch.
    shards = [(0, 8), (10, 10), (20, 8), (30, 10)]
    data = StreamingShardedDataset(shards, IterableReader(read_range), steps_per_epoch=4)
    source = ResumableDataLoader(data, batch_size=2, seed=1, num_workers=2, persistent_workers=True)
    prefetcher, inners = cuda_prefetcher(source), []
    for _ in range(3):
        for _, _batch in zip(range(len(source)), prefetcher, strict=False):
            pass
        inners.append(source._engine._inner)
    assert inners[0] is not None and all(inner is inners[0] for inner in inners)


class _Numbers(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        yield from range(100, 108)


def _read_range(shard: tuple[int, int]) -> Iterator[int]:
    yield from range(shard[0], shard[0] + shard[1])


@pytest.mark.parametrize("kind", ["plan", "stream", "iterable"])
def test_a_batch_whose_pinning_fails_is_not_counted_as_handed_out(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hunter 336: the stream and iterable engines moved their position before pinning, so a
    # pin that failed (pinned memory exhausted) lost that batch from the saved state.
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: cuda)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 1)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    failing = [True]

    def pin(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if failing[0] and self.numel() and int(self.flatten()[0]) == 100:
            raise RuntimeError("CUDA error: out of memory (pinning, simulated)")
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, *a: False)

    def loader() -> ResumableDataLoader:
        data: Any = list(range(100, 108))
        if kind == "stream":
            shards = [(100, 4), (200, 4)]
            data = StreamingShardedDataset(
                shards, IterableReader(_read_range), shuffle_shards=False
            )
        elif kind == "iterable":
            data = _Numbers()
        return ResumableDataLoader(data, batch_size=2, seed=0, pin_memory=True)

    cut = loader()
    with pytest.raises(RuntimeError, match="out of memory"):
        next(iter(cut))
    state = cut.state_dict()
    failing[0] = False
    resumed = loader()
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in loader()]
