"""The persistent Gluon FP4-KV decode attention's work partition (paged_attention_gluon_persistent.py), on CPU: which
(sequence, kv head) items each program runs, the ring positions its producer and consumer give them, the item the
consumer prefetches, and the ring protocol across items (a replay of the mbarrier phases). The kernel itself runs only
on an sm_90 GPU (tests/kernels/test_paged_attention_gluon.py, -m gpu, `persistent`)."""

import pytest
import torch

persistent = pytest.importorskip("trace_rl.kernels.paged_attention_gluon_persistent")


def test_grid_is_one_program_per_resident_slot_at_most_one_per_item():
    assert persistent.persistent_grid(313 * 8, 132, 2) == 264          # the fixed workload: 9-10 items each
    assert persistent.persistent_grid(32 * 8, 132, 2) == 256           # fewer items than slots: one each
    assert persistent.persistent_grid(0, 132, 2) == 0                  # nothing to launch


@pytest.mark.parametrize("batch, kv_heads, grid", [(313, 8, 264), (32, 8, 256), (7, 3, 5), (1, 8, 3), (5, 2, 1)])
def test_items_cover_every_sequence_and_head_once_balanced(batch, kv_heads, grid):
    work = batch * kv_heads
    seen = []
    counts = []
    for pid in range(grid):
        items = persistent.work_items(pid, grid, work, kv_heads)
        seen += items
        counts.append(len(items))
    assert sorted(seen) == [(b, h) for b in range(batch) for h in range(kv_heads)]
    assert max(counts) - min(counts) <= 1 and sum(counts) == work
    # the shipped kernel's program (h, b) is item b * kv_heads + h
    assert persistent.work_items(0, grid, work, kv_heads)[0] == (0, 0)


@pytest.mark.parametrize("grid", [1, 3, 7, 264])
def test_consumer_prefetches_the_next_item(grid):
    """The consumer loads item min(w + grid, work - 1)'s length and q under item w's epilogue: the next item it
    runs, and an item in range after its last (a load never read)."""
    work = 21 * 8
    for pid in range(min(grid, work)):
        ws = list(range(pid, work, grid))
        for i, w in enumerate(ws):
            wn = min(w + grid, work - 1)
            assert 0 <= wn < work
            if i + 1 < len(ws):
                assert wn == ws[i + 1]


def test_schedule_ring_positions_are_contiguous_and_skip_empty_sequences():
    lens = [257, 0, 1, 128, 129, 8447, 0]
    sched = persistent.schedule(lens, 2, 3)
    assert sorted((b, h) for items in sched for b, h, _, _ in items) == [(b, h) for b in range(7) for h in range(2)]
    for items in sched:
        j = 0
        for b, _, j0, n in items:
            assert j0 == j and n == -(-lens[b] // 128)
            j += n
    assert [n for b, h, j0, n in sched[0]] == [3, 0, 1, 2, 0]         # items 0, 3, 6, 9, 12


@pytest.mark.parametrize("stages", [2, 4])
def test_ring_protocol_across_items(stages):
    """Replay of the ready / empty mbarriers as producer and consumer use them (slot j % STAGES; a wait on parity P
    passes while the barrier's completed phases' parity differs from P: the consumer waits on (j // STAGES) & 1, the
    producer on its flip), in random interleavings: at every ring position, across items, the consumer reads the
    tile the producer put there for that position."""
    lens = [257, 1, 0, 300, 64, 129, 8447 // 64]
    gen = torch.Generator().manual_seed(stages)
    for items in persistent.schedule(lens, 2, 4):
        tiles = [(b, h, it) for b, h, _, n in items for it in range(n)]
        slots = [None] * stages
        ready, empty = [0] * stages, [0] * stages        # completed phases per slot
        p = c = 0
        while c < len(tiles):
            can_p = p < len(tiles) and (empty[p % stages] & 1) != (((p // stages) & 1) ^ 1)
            can_c = (ready[c % stages] & 1) != ((c // stages) & 1)
            assert can_p or can_c, "deadlock"
            if can_p and (not can_c or torch.rand(1, generator=gen).item() < 0.5):
                slots[p % stages] = tiles[p]
                ready[p % stages] += 1
                p += 1
            else:
                assert slots[c % stages] == tiles[c] and c < p
                empty[c % stages] += 1
                c += 1
        assert p == c == len(tiles)


def test_items_assemble_the_reference():
    """Each item's output rows are its kv head's query heads of its sequence: running the reference item by item in
    the programs' order gives the whole batch's (empty sequences: zeros)."""
    from trace_rl.formats.paged_kv import PagedKV
    from trace_rl.kernels import kv_write
    from trace_rl.kernels.attention_reference import decode_attention_reference

    gen = torch.Generator().manual_seed(0)
    lens, hkv, group, page = [5, 0, 70, 1], 2, 3, 64
    pages = [-(-n // page) for n in lens]
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages):
        table[b, :n] = torch.arange(used, used + n)
        used += n
    k = PagedKV.allocate("nvfp4", used, page, hkv, 128, role="k")
    v = PagedKV.allocate("nvfp4", used, page, hkv, 128, role="v")
    slots = torch.arange(used * page)
    kv_write(k, slots, torch.randn(used * page, hkv, 128, generator=gen).to(torch.bfloat16))
    kv_write(v, slots, torch.randn(used * page, hkv, 128, generator=gen).to(torch.bfloat16))
    q = torch.randn(len(lens), hkv * group, 128, generator=gen).to(torch.bfloat16)
    sl = torch.tensor(lens, dtype=torch.int32)
    want = decode_attention_reference(q, k, v, table, sl, 0.1).float()
    out = torch.full_like(want, float("nan"))
    for items in persistent.schedule(lens, hkv, 3):
        for b, h, _, _ in items:
            rows = slice(h * group, (h + 1) * group)
            if lens[b] == 0:
                out[b, rows] = 0
                continue
            out[b, rows] = decode_attention_reference(q[b : b + 1], k, v, table[b : b + 1], sl[b : b + 1],
                                                      0.1).float()[0, rows]
    assert torch.equal(out, want)
