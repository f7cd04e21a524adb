"""The token-tile order of the Gluon grouped FP4 GEMM's persistent programs (fp4_grouped_gluon.py), and a pure-Python
model of each order that the tests check the kernel's partitions against.

Two orders:
- `expert` (shipped): work items are (expert, N tile); program `pid` takes items pid, pid + nprog, ... and runs all of
  an item's token tiles (an expert over BM rows: 2+ tiles in one item). The items' costs differ (1 or 2 tiles at
  25-32 rows per expert and BM = 32), and which programs draw the 2-tile items is up to the router: at B = 409
  (10 of 128 experts over 32 rows) the static round-robin gives some programs 8 tiles where the mean is 6.3; at
  B = 512 (59 over 32) up to ~12 against a mean of 8.5. The slowest program sets the time.
- `balanced` (candidate, issue 15 at 409-512 tokens): the work is the flat list of token tiles (expert, m tile,
  N tile), N tile fastest (consecutive programs share an expert's activation tile and, an m tile later, its weight
  tile in L2); program pid takes tiles pid, pid + nprog, ...: every program runs floor or ceil(tiles / nprog) tiles.
  Each partition of each program builds the list's prefix itself (one vector load of the E + 1 offsets, a scan:
  `tile_prefix`; no extra launch, no synchronisation with the host) and finds a tile's expert with two reductions
  over it (`locate`). Every output tile is still computed by one program with the same K order: bits unchanged.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


def expert_schedule(offsets: list[int], n_tiles: int, block_m: int, pid: int, nprog: int) -> list[tuple[int, int, int]]:
    """Program `pid`'s (expert, N tile, first row) token tiles in the `expert` order."""
    E = len(offsets) - 1
    out = []
    for w in range(pid, E * n_tiles, nprog):
        e, n = divmod(w, n_tiles)
        rows = max(offsets[e + 1] - offsets[e], 0)
        out += [(e, n, offsets[e] + mt * block_m) for mt in range(-(-rows // block_m))]
    return out


def balanced_schedule(offsets: list[int], n_tiles: int, block_m: int, pid: int,
                      nprog: int) -> list[tuple[int, int, int]]:
    """Program `pid`'s (expert, N tile, first row) token tiles in the `balanced` order, found as `locate` finds them
    (inclusive prefix of tiles per expert; the expert = how many prefixes are <= t)."""
    E = len(offsets) - 1
    incl, acc = [], 0
    for e in range(E):
        acc += -(-max(offsets[e + 1] - offsets[e], 0) // block_m) * n_tiles
        incl.append(acc)
    out = []
    for t in range(pid, acc, nprog):
        e = sum(v <= t for v in incl)
        local = t - max([v for v in incl if v <= t], default=0)
        mt, n = divmod(local, n_tiles)
        out.append((e, n, offsets[e] + mt * block_m))
    return out


def program_tiles(offsets: list[int], n_tiles: int, block_m: int, nprog: int, balanced: bool) -> list[int]:
    """Token tiles per program (the slowest program's count bounds the launch: `max(...)`)."""
    sched = balanced_schedule if balanced else expert_schedule
    return [len(sched(offsets, n_tiles, block_m, p, nprog)) for p in range(nprog)]


@gluon.constexpr_function
def expert_layout(num_warps, EP):
    """[EP] experts over one warp (EP / 32 per lane), replicated over the partition's other warps: the reductions in
    `locate` stay inside a warp (shuffles, no shared memory or barrier)."""
    return gl.BlockedLayout([max(EP // 32, 1)], [32], [num_warps], [0])


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def tile_prefix(off_ptr, E, NT, BM: gl.constexpr, EP: gl.constexpr):
    """incl [EP] int32: token tiles (m tiles x NT) of experts 0 .. e, inclusive (experts >= E: the total)."""
    L: gl.constexpr = expert_layout(gl.num_warps(), EP)
    i = gl.arange(0, EP, layout=L)
    m = i < E
    starts = gl.load(off_ptr + i, mask=m, other=0)
    ends = gl.load(off_ptr + i + 1, mask=m, other=0)
    tiles = gl.cdiv(gl.maximum(ends - starts, 0), BM) * NT
    return gl.associative_scan(tiles, 0, _add)


@gluon.jit
def locate(t, incl, NT):
    """(expert, m tile, N tile) of flat tile t: the expert is the number of inclusive prefixes <= t, its first tile the
    largest of them (0 for expert 0)."""
    before = incl <= t
    e = gl.sum(before.to(gl.int32), axis=0)
    local = t - gl.max(gl.where(before, incl, 0), axis=0)
    mt = local // NT
    return e, mt, local - mt * NT
