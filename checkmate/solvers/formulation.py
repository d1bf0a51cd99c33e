"""The Checkmate MILP (Jain et al., MLSys 2020) in backend-neutral sparse form.

This is the only module that speaks in the paper's letters. For a graph with nodes ``0..n-1`` in
topological order and ``n`` frontier-advancing stages:

* ``R[t, i]`` (binary): node ``i`` is computed in stage ``t``;
* ``S[t, i]`` (binary): value ``i`` is resident on entry to stage ``t``;
* ``FREE[t, i, k]``: value ``i`` (an input of ``k``, or ``k`` itself) is freed right after ``k`` runs
  in stage ``t``;
* ``U[t, k]``: bytes in use while ``k`` runs in stage ``t`` (fixed bytes excluded), ``<= budget - fixed``.

Stage structure fixes most of the matrix: ``R[t, t] = 1``; nothing above the diagonal; ``S[t, i] = 0``
for ``i >= t``; outputs are held from the stage after they are computed to the end
(``S[t, i] = 1, R[t, i] = 0`` for ``t > i``); non-recomputable nodes have ``R[t, i] = 0`` for ``t > i``;
a value none of whose descendants is at or beyond stage ``t`` is dead there (``R = S = 0``). Fixed
cells are not variables: their constants are folded into the rows.

Memory follows :mod:`checkmate.simulate` exactly (docs/design.md §3)::

    U[t, k0] = sum_i mem[i] S[t, i] + mem[k0] R[t, k0]              (k0: first node stage t may run)
    U[t, k]  = U[t, k'] + mem[k] R[t, k] - sum_i mem[i] FREE[t, i, k']   (k' the previous such node)

``FREE`` is linearised per value ``i`` over its *positions* ``p_0 = i < p_1 < ...`` (``i`` and its
users) in the stage: a value can be freed at most once, only after a node that runs, and only after its
last use, and not if it is held into ``t + 1``::

    FREE[t, i, k] <= R[t, k]                                            (the published fix)
    sum_k FREE[t, i, k] + S[t+1, i] <= 1
    sum_k FREE[t, i, k] + S[t+1, i] <= R[t, i] + S[t, i]                 (flow; implies the carry
                                                                          S[t+1, i] <= R + S)
    sum_{k < j} FREE[t, i, k] + R[t, j] <= 1        for each user j of i      (one row per j,
                                                                               a clique cut)
Those rows make the FREE polytope integral once R and S are, so ``FREE`` needs no integrality and the
solver branches only on ``R`` and ``S``. A value freed right after its own computation (``i == k``)
was computed for nothing; schedules are read back through the minimal R, which never does that, so
those cells are not modelled either (a third of all FREE cells). The published lower half of the definition
(``FREE >= R[t,k] - S[t+1,i] - sum_{j>k} R[t,j]``) never tightens the model: frees only relax the
memory rows, so an optimiser frees whatever it may. It is available as ``exact_free=True`` (one row
per FREE cell) when the solver's own ``U`` must equal the simulator's accounting cell by cell;
:meth:`CheckmateFormulation.encode` computes the exact FREE and U of any (R, S) either way.
Frees after the stage's last node (``k = t``) never reach a memory row and are not modelled.
``R[t, i] + S[t, i] <= 1`` is added only with ``exact_free`` (see :func:`build_formulation`).

The flow row is the tightening that matters. Without it the relaxation may free a value that is
present in a stage with weight 1/2 once after each of two users, so the memory rows subtract it twice,
and the LP bound sits far below the optimum; with the flow row it is above what HiGHS reaches with
all its root cuts (experiments/results/README.md, section i).
It is valid for every integral (R, S): a value absent from a stage is neither freed nor kept there.

Residency rows restate the memory rows as knapsacks over the binaries alone. While ``k`` runs in
stage ``t``, its inputs and output (its working set ``W[k]``) are resident, and so is every value
``i < k`` held into ``t + 1`` (it is never freed in ``t``, and it is there since the stage began or
since its own recomputation before ``k``)::

    sum_{i < k, i not an input of k} mem[i] S[t+1, i] + W[k] R[t, k] <= cap

With the flow rows they left the LP bound unchanged on every graph measured (without them they can
lift it as far: synthetic U-Net, 3 levels, near its minimum budget), but they are what the solver's
cover cuts need: once the relaxation is tight, the remaining gap is which values to hold through the
stages where memory binds. One row per stage at its own node (``R[t, t] = 1``), and
one at every other position whose working set is at least a set share of the memory (rows at every
position slow the LPs down more than they help). They made the exact solves of the tight budgets
measured two to three times faster (experiments/results/README.md, section i).

Reading a solution back (:mod:`checkmate.solvers.candidates`) uses S alone: holds that nothing uses are
pruned and R is re-derived as the minimal recomputation, which is at least as cheap and as small as
any R the solver chose for that S, so the model's freedoms above never reach a returned schedule.

Memory is measured in units of ``mem_unit_bytes``: the gcd of the sizes when that keeps every row
integral and small (exact under solver tolerances), otherwise a float scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from checkmate.solvers.sparse_model import Rows, SparseModel, cost_granularity

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["CheckmateFormulation", "build_formulation", "max_strict_descendant"]

# Largest total memory, in units, for which integral units are used: with integrality tolerances of
# 1e-6 a rounded solution then differs from the solver's rows by less than one unit, so the budget row
# stays exact.
_INTEGRAL_UNITS_MAX = 10**5
# Float scale otherwise: the largest value becomes this many units (keeps coefficients near 1..1e3).
_FLOAT_UNITS_PER_MAX = 1000.0
# Positions other than a stage's own node get a residency row when their working set is at least this
# share of the memory: fewer rows slow the proofs, more slow the LPs. Any fraction is passed as
# checkmate.solve(..., working_set_fraction=F). Measured: experiments/results/README.md, section i.
_WORKING_SET_FRACTION = 0.35
# Residency rows are screened in chunks of candidate rows, each chunk a (rows x n) boolean matrix of
# at most this many cells (2 MB): large graphs would otherwise need an n^2-row matrix at once.
_RESIDENCY_CELLS_PER_CHUNK = 2_000_000


def max_strict_descendant(graph: "Graph") -> np.ndarray:
    """For each node, the largest id among its descendants (-1 when it has none)."""
    n = graph.n
    out = np.full(n, -1, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        best = -1
        for u in graph.users[i]:
            best = max(best, u, int(out[u]))
        out[i] = best
    return out


def _mem_units(graph: "Graph", budget_bytes: int, force_integral: bool = False) -> tuple[float, np.ndarray, float, bool]:
    mem = graph.mem.astype(np.int64)
    avail = int(budget_bytes) - int(graph.fixed_mem)
    nonzero = mem[mem > 0]
    if nonzero.size == 0:
        return 1.0, mem.astype(np.float64), float(avail), True
    g = int(np.gcd.reduce(nonzero))
    if force_integral or int(nonzero.sum()) // g <= _INTEGRAL_UNITS_MAX:
        cap = math.floor(avail / g) if avail >= 0 else -1.0
        return float(g), (mem // g).astype(np.float64), float(cap), True
    unit = float(nonzero.max()) / _FLOAT_UNITS_PER_MAX
    return unit, mem / unit, avail / unit, False


@dataclass
class CheckmateFormulation:
    """The MILP for one graph and budget, plus the maps between its columns and (R, S)."""

    graph: "Graph"
    budget_bytes: int
    model: SparseModel
    mem_unit_bytes: float
    cap_units: float
    r_col: np.ndarray          # (n, n): column of R[t, i], or -1 when the cell is fixed
    s_col: np.ndarray
    r_fixed: np.ndarray        # (n, n) bool: value of the fixed R cells (meaningful where r_col < 0)
    s_fixed: np.ndarray
    free_t: np.ndarray         # FREE columns: stage, value, node after which it is freed
    free_i: np.ndarray
    free_k: np.ndarray
    free_col0: int
    u_t: np.ndarray            # U columns: stage and node of each
    u_k: np.ndarray
    u_col0: int
    exact_free: bool
    stats: dict = field(default_factory=dict)

    # ------------------------------------------------------------------------ columns <-> (R, S)
    def decode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(R, S) boolean matrices from a solution vector (cells rounded at one half)."""
        x = np.asarray(x, dtype=np.float64)
        R = self.r_fixed.copy()
        S = self.s_fixed.copy()
        rv = self.r_col >= 0
        sv = self.s_col >= 0
        R[rv] = x[self.r_col[rv]] > 0.5
        S[sv] = x[self.s_col[sv]] > 0.5
        return R, S

    def retain_values(self, x: np.ndarray) -> np.ndarray:
        """S as floats (for rounding a relaxation); fixed cells at their values."""
        S = self.s_fixed.astype(np.float64)
        sv = self.s_col >= 0
        S[sv] = np.clip(np.asarray(x, dtype=np.float64)[self.s_col[sv]], 0.0, 1.0)
        return S

    def exact_free_matrix(self, R: np.ndarray, S: np.ndarray) -> np.ndarray:
        """FREE for each modelled cell, by the memory model's definition, given boolean (R, S)."""
        n = self.graph.n
        t, i, k = self.free_t, self.free_i, self.free_k
        if t.size == 0:
            return np.zeros(0)
        # last[t, i]: the last position (i itself or a user of i) that runs in stage t, -1 if none
        diag_run = R & np.tri(n, dtype=bool)
        last = np.where(diag_run, np.arange(n)[None, :], -1)
        for u, v in self.graph.edges:  # u is an input of v: v is a position of value u
            run = R[:, v]
            last[:, u] = np.where(run & (v > last[:, u]), v, last[:, u])
        held_next = np.zeros(t.shape, dtype=bool)
        nxt = t + 1 < n
        held_next[nxt] = S[t[nxt] + 1, i[nxt]]
        return ((last[t, i] == k) & R[t, k] & ~held_next).astype(np.float64)

    def encode(self, R: np.ndarray, S: np.ndarray) -> np.ndarray:
        """The solution vector of (R, S): R and S cells, exact FREE, and U from the memory rows."""
        R = np.asarray(R, dtype=bool)
        S = np.asarray(S, dtype=bool)
        m = self.model
        x = np.zeros(m.num_cols)
        rv = self.r_col >= 0
        sv = self.s_col >= 0
        x[self.r_col[rv]] = R[rv]
        x[self.s_col[sv]] = S[sv]
        x[self.free_col0:self.free_col0 + self.free_t.size] = self.exact_free_matrix(R, S)
        x[self.u_col0:self.u_col0 + self.u_t.size] = self.memory_units(R, S)
        return x

    def memory_units(self, R: np.ndarray, S: np.ndarray) -> np.ndarray:
        """U at every modelled (t, k), in units, for boolean (R, S), following the memory rows."""
        n = self.graph.n
        mem = self._mem_scaled
        R = np.asarray(R, dtype=bool)
        S = np.asarray(S, dtype=bool)
        free = self.exact_free_matrix(R, S)
        freed = np.zeros((n, n))
        np.add.at(freed, (self.free_t, self.free_k), free * mem[self.free_i])
        held = (np.tril(S, -1) * mem[None, :]).sum(axis=1)
        # U at position k = held + allocations up to k - frees after positions before k
        alloc = np.cumsum(np.tril(R) * mem[None, :], axis=1)
        released = np.cumsum(freed, axis=1) - freed
        U = held[:, None] + alloc - released
        return U[self.u_t, self.u_k]

    def peak_bytes(self, R: np.ndarray, S: np.ndarray) -> int:
        """The MILP's own peak for (R, S): max U, in bytes, fixed bytes included."""
        units = self.memory_units(R, S)
        return int(round(float(units.max(initial=0.0)) * self.mem_unit_bytes)) + int(self.graph.fixed_mem)

    def solution_peak_bytes(self, x: np.ndarray) -> int:
        """Max of the U columns of a solver's solution, in bytes, fixed bytes included."""
        u = np.asarray(x)[self.u_col0:self.u_col0 + self.u_t.size]
        return int(round(float(u.max(initial=0.0)) * self.mem_unit_bytes)) + int(self.graph.fixed_mem)

    @property
    def _mem_scaled(self) -> np.ndarray:
        return self.graph.mem / self.mem_unit_bytes

    def with_budget(self, budget_bytes: int) -> "CheckmateFormulation":
        """Same model with another budget (only the U column bounds change)."""
        unit = self.mem_unit_bytes
        avail = int(budget_bytes) - int(self.graph.fixed_mem)
        cap = (math.floor(avail / unit) if self.model.integral_rows else avail / unit) if avail >= 0 else -1.0
        m = self.model
        col_hi = m.col_hi.copy()
        col_hi[self.u_col0:self.u_col0 + self.u_t.size] = cap
        model = replace(m, col_hi=col_hi)
        out = CheckmateFormulation(**{**self.__dict__, "model": model, "budget_bytes": int(budget_bytes),
                                      "cap_units": float(cap)})
        return out


# ---------------------------------------------------------------------------------- columns
@dataclass
class _Cells:
    """The model's columns and the index arrays that the row families share.

    Columns come in the order R, S, FREE, U. ``*_col`` maps a cell to its column (-1 when the cell is
    fixed, its value then in ``*_fixed``); FREE cells ``(f_t, f_i, f_k)`` are sorted by stage, value,
    node, so the cells of one value in one stage (a *group*) are consecutive; U cells ``(u_t, u_k)``
    are every position where a node may run, sorted by stage then node.
    """

    n: int
    mem: np.ndarray            # sizes in memory units
    cap: float                 # units U may reach (budget minus fixed bytes)
    edges: np.ndarray          # (e, 2): input, user
    adj: np.ndarray            # adj[i, k]: i is an input of k
    tt: np.ndarray             # every (t, i) with i < t, row-major
    ii: np.ndarray
    r_col: np.ndarray
    s_col: np.ndarray
    r_fixed: np.ndarray
    s_fixed: np.ndarray
    r_is_var: np.ndarray
    s_is_var: np.ndarray
    r_possible: np.ndarray     # R[t, k] may be 1
    f_t: np.ndarray
    f_i: np.ndarray
    f_k: np.ndarray
    f_col: np.ndarray
    free_col0: int
    group_key: np.ndarray      # t * n + i of each FREE cell
    g_start: np.ndarray        # first FREE cell of each group
    g_id: np.ndarray           # group of each FREE cell
    g_t: np.ndarray
    g_i: np.ndarray
    has_group: np.ndarray      # has_group[t, i]: value i has FREE cells in stage t
    u_t: np.ndarray
    u_k: np.ndarray
    u_col0: int
    num_cols: int

    @property
    def nf(self) -> int:
        return int(self.f_t.size)

    @property
    def ng(self) -> int:
        return int(self.g_start.size)

    @property
    def nu(self) -> int:
        return int(self.u_t.size)


def _cells(graph: "Graph", mem: np.ndarray, cap: float) -> _Cells:
    """Columns of R, S, FREE and U, with the cells that stage structure fixes left out."""
    n = graph.n
    output = graph.output
    recomputable = graph.recomputable
    maxdesc = max_strict_descendant(graph)
    adj = np.zeros((n, n), dtype=bool)
    edges = np.array(graph.edges, dtype=np.int64).reshape(-1, 2)
    adj[edges[:, 0], edges[:, 1]] = True

    tt, ii = np.tril_indices(n, -1)   # all (t, i) with i < t, row-major
    # --- fixed cells
    r_fixed = np.eye(n, dtype=bool)
    s_fixed = np.zeros((n, n), dtype=bool)
    r_is_var = np.zeros((n, n), dtype=bool)
    s_is_var = np.zeros((n, n), dtype=bool)
    dead = (~output[ii]) & (maxdesc[ii] < tt)
    r_is_var[tt, ii] = recomputable[ii] & ~output[ii] & ~dead
    s_is_var[tt, ii] = ~output[ii] & ~dead
    s_fixed[tt, ii] = output[ii]

    num = 0
    r_col = np.full((n, n), -1, dtype=np.int64)
    cnt = int(r_is_var.sum())
    r_col[r_is_var] = np.arange(num, num + cnt)
    num += cnt
    s_col = np.full((n, n), -1, dtype=np.int64)
    cnt = int(s_is_var.sum())
    s_col[s_is_var] = np.arange(num, num + cnt)
    num += cnt

    r_possible = r_is_var | r_fixed

    # --- FREE cells (t, i, k): k < t, i in deps(k), R[t, k] not fixed to 0, i not an output, i not an
    # input of t (t runs last in the stage and reads i). A value freed right after its own computation
    # (i == k < t) was computed for nothing; schedules are read back through the minimal R, which never
    # does that, so those cells are left out (with exact_free they are thereby forbidden).
    pair_i = np.concatenate([np.arange(n), edges[:, 0]])
    pair_k = np.concatenate([np.arange(n), edges[:, 1]])
    reps = n - 1 - pair_k
    f_i = np.repeat(pair_i, reps)
    f_k = np.repeat(pair_k, reps)
    start = np.repeat(np.cumsum(reps) - reps, reps)
    f_t = f_k + 1 + (np.arange(f_i.size) - start)
    keep = r_possible[f_t, f_k] & ~output[f_i] & ~adj[f_i, f_t] & (f_i != f_k)
    f_t, f_i, f_k = f_t[keep], f_i[keep], f_k[keep]
    order = np.lexsort((f_k, f_i, f_t))
    f_t, f_i, f_k = f_t[order], f_i[order], f_k[order]
    free_col0 = num
    nf = f_t.size
    f_col = np.arange(num, num + nf)
    num += nf

    # --- FREE groups (t, i): the cells of one value in one stage, consecutive after the sort above.
    group_key = f_t * n + f_i
    g_start = np.flatnonzero(np.r_[True, group_key[1:] != group_key[:-1]]) if nf else np.zeros(0, dtype=np.int64)
    g_id = np.cumsum(np.r_[False, group_key[1:] != group_key[:-1]]) if nf else np.zeros(0, dtype=np.int64)
    g_t, g_i = f_t[g_start], f_i[g_start]
    has_group = np.zeros((n, n), dtype=bool)
    has_group[g_t, g_i] = True

    # --- U cells: every (t, k) where k may run in stage t
    u_t, u_k = np.nonzero(np.tril(r_possible))
    u_col0 = num
    num += u_t.size

    return _Cells(n=n, mem=mem, cap=cap, edges=edges, adj=adj, tt=tt, ii=ii, r_col=r_col, s_col=s_col,
                  r_fixed=r_fixed, s_fixed=s_fixed, r_is_var=r_is_var, s_is_var=s_is_var, r_possible=r_possible,
                  f_t=f_t, f_i=f_i, f_k=f_k, f_col=f_col, free_col0=free_col0, group_key=group_key,
                  g_start=g_start, g_id=g_id, g_t=g_t, g_i=g_i, has_group=has_group, u_t=u_t, u_k=u_k,
                  u_col0=u_col0, num_cols=num)


# ---------------------------------------------------------------------------------- row families
def _rows_compute_requires_inputs(rows: Rows, c: _Cells) -> None:
    """``R[t, k] <= R[t, i] + S[t, i]`` for each input ``i`` of ``k`` and stage ``t >= k``."""
    n, edges = c.n, c.edges
    e_rep = n - edges[:, 1]
    d_i = np.repeat(edges[:, 0], e_rep)
    d_k = np.repeat(edges[:, 1], e_rep)
    d_start = np.repeat(np.cumsum(e_rep) - e_rep, e_rep)
    d_t = d_k + (np.arange(d_i.size) - d_start)
    live = c.r_possible[d_t, d_k]
    d_t, d_i, d_k = d_t[live], d_i[live], d_k[live]
    rid = rows.new(d_t.size, -np.inf, 0.0)
    rows.term(rid, c.r_col[d_t, d_k], 1.0, c.r_fixed[d_t, d_k])
    rows.term(rid, c.r_col[d_t, d_i], -1.0, c.r_fixed[d_t, d_i])
    rows.term(rid, c.s_col[d_t, d_i], -1.0, c.s_fixed[d_t, d_i])


def _rows_retain_requires_prior(rows: Rows, c: _Cells, flow_rows: bool) -> None:
    """``S[t+1, i] <= S[t, i] + R[t, i]`` (``i < t``), where no flow row implies it."""
    n, tt, ii = c.n, c.tt, c.ii
    c_t, c_i = tt[tt + 1 < n], ii[tt + 1 < n]
    live = (c.s_is_var[c_t + 1, c_i] | c.s_fixed[c_t + 1, c_i]) & ~(flow_rows & c.has_group[c_t, c_i])
    c_t, c_i = c_t[live], c_i[live]
    rid = rows.new(c_t.size, -np.inf, 0.0)
    rows.term(rid, c.s_col[c_t + 1, c_i], 1.0, c.s_fixed[c_t + 1, c_i])
    rows.term(rid, c.s_col[c_t, c_i], -1.0, c.s_fixed[c_t, c_i])
    rows.term(rid, c.r_col[c_t, c_i], -1.0, c.r_fixed[c_t, c_i])


def _rows_compute_or_retain(rows: Rows, c: _Cells) -> None:
    """``R[t, i] + S[t, i] <= 1`` where both cells are variables (the optional exclusive rows)."""
    both = c.r_is_var[c.tt, c.ii] & c.s_is_var[c.tt, c.ii]
    x_t, x_i = c.tt[both], c.ii[both]
    rid = rows.new(x_t.size, -np.inf, 1.0)
    rows.term(rid, c.r_col[x_t, x_i], 1.0)
    rows.term(rid, c.s_col[x_t, x_i], 1.0)


def _rows_free_requires_compute(rows: Rows, c: _Cells) -> None:
    """``FREE[t, i, k] <= R[t, k]`` (the published fix: only a node that runs frees anything)."""
    rid = rows.new(c.nf, -np.inf, 0.0)
    rows.term(rid, c.f_col, 1.0)
    rows.term(rid, c.r_col[c.f_t, c.f_k], -1.0, c.r_fixed[c.f_t, c.f_k])


def _leave_stage_terms(rows: Rows, c: _Cells, rid: np.ndarray) -> None:
    """``sum_k FREE[t, i, k] + S[t+1, i]`` into the row of each group ``(t, i)``."""
    nxt = c.g_t + 1 < c.n
    rows.term(rid[c.g_id], c.f_col, 1.0)
    rows.term(rid[nxt], c.s_col[c.g_t[nxt] + 1, c.g_i[nxt]], 1.0, c.s_fixed[c.g_t[nxt] + 1, c.g_i[nxt]])


def _rows_free_at_most_once(rows: Rows, c: _Cells) -> None:
    """``sum_k FREE[t, i, k] + S[t+1, i] <= 1``: a value is freed at most once, and not if held on."""
    rid = rows.new(c.ng, -np.inf, 1.0)
    _leave_stage_terms(rows, c, rid)


def _rows_flow(rows: Rows, c: _Cells) -> None:
    """``sum_k FREE[t, i, k] + S[t+1, i] <= R[t, i] + S[t, i]``: a value leaves a stage (freed or
    kept) at most as often as it is present in it (this implies the carry row of ``(t, i)``)."""
    rid = rows.new(c.ng, -np.inf, 0.0)
    _leave_stage_terms(rows, c, rid)
    rows.term(rid, c.r_col[c.g_t, c.g_i], -1.0, c.r_fixed[c.g_t, c.g_i])
    rows.term(rid, c.s_col[c.g_t, c.g_i], -1.0, c.s_fixed[c.g_t, c.g_i])


def _rows_free_after_last_use(rows: Rows, c: _Cells, graph: "Graph") -> None:
    """``sum_{k < j} FREE[t, i, k] + R[t, j] <= 1`` for each user ``j`` of ``i`` with ``k < j < t``:
    no value is freed before a later use (one row per ``(t, i, j)``, a clique cut)."""
    n, f_t, f_i, f_k = c.n, c.f_t, c.f_i, c.f_k
    # Build (FREE cell, later user j) pairs by repeating each FREE cell over the users of its value.
    n_users = np.array([len(u) for u in graph.users], dtype=np.int64)
    users_flat = np.array([u for us in graph.users for u in us], dtype=np.int64)
    users_start = np.cumsum(n_users) - n_users
    rep = n_users[f_i]
    p_cell = np.repeat(np.arange(c.nf), rep)
    p_off = np.arange(p_cell.size) - np.repeat(np.cumsum(rep) - rep, rep)
    p_j = users_flat[users_start[f_i[p_cell]] + p_off] if p_cell.size else np.zeros(0, dtype=np.int64)
    pt, pi, pk = f_t[p_cell], f_i[p_cell], f_k[p_cell]
    ok = (p_j > pk) & (p_j < pt) & c.r_is_var[pt, p_j]
    p_cell, p_j, pt, pi = p_cell[ok], p_j[ok], pt[ok], pi[ok]
    row_key = (pt * n + pi) * n + p_j
    uniq, inv = np.unique(row_key, return_inverse=True)
    rid = rows.new(uniq.size, -np.inf, 1.0)
    rows.term(rid[inv], c.f_col[p_cell], 1.0)
    ut = uniq // (n * n)
    uj = uniq % n
    rows.term(rid, c.r_col[ut, uj], 1.0)


def _rows_free_definition(rows: Rows, c: _Cells) -> None:
    """``sum_k FREE[t, i, k] + S[t+1, i] >= R[t, p]`` for every position ``p`` of value ``i`` in stage
    ``t``: a value that the stage touches and does not keep is freed (the exact FREE definition)."""
    n, nf, ng = c.n, c.nf, c.ng
    f_t, f_i, f_k, f_col, g_id = c.f_t, c.f_i, c.f_k, c.f_col, c.g_id
    tt, ii = c.tt, c.ii
    # Positions after which i may be freed: one row per FREE cell, holding every FREE cell of its group.
    rid = rows.new(nf, 0.0, np.inf)
    g_size = np.bincount(g_id, minlength=ng)
    g_first = np.cumsum(g_size) - g_size
    rep = g_size[g_id]
    row_of_cell = np.repeat(rid, rep)
    offset_in_group = np.arange(row_of_cell.size) - np.repeat(np.cumsum(rep) - rep, rep)
    members = np.repeat(g_first[g_id], rep) + offset_in_group
    rows.term(row_of_cell, f_col[members], 1.0)
    nxt = f_t + 1 < n
    rows.term(rid[nxt], c.s_col[f_t[nxt] + 1, f_i[nxt]], 1.0, c.s_fixed[f_t[nxt] + 1, f_i[nxt]])
    rows.term(rid, c.r_col[f_t, f_k], -1.0, c.r_fixed[f_t, f_k])
    # ... and the value's own computation (p = i): nothing is computed only to be dropped.
    own = c.r_is_var[tt, ii] & ~c.adj[ii, tt]
    o_t, o_i = tt[own], ii[own]
    rid = rows.new(o_t.size, 0.0, np.inf)
    rows.term(rid, c.r_col[o_t, o_i], -1.0)
    nxt = o_t + 1 < n
    rows.term(rid[nxt], c.s_col[o_t[nxt] + 1, o_i[nxt]], 1.0, c.s_fixed[o_t[nxt] + 1, o_i[nxt]])
    group_keys = c.group_key[c.g_start]
    pos = np.searchsorted(group_keys, o_t * n + o_i) if ng else np.zeros(o_t.size, dtype=np.int64)
    has = (pos < ng) & (group_keys[np.minimum(pos, max(ng - 1, 0))] == o_t * n + o_i) if ng \
        else np.zeros(o_t.size, dtype=bool)
    g_of = pos[has]
    rep = g_size[g_of]
    row_rep = np.repeat(rid[has], rep)
    offset_in_group = np.arange(row_rep.size) - np.repeat(np.cumsum(rep) - rep, rep)
    rows.term(row_rep, f_col[np.repeat(g_first[g_of], rep) + offset_in_group], 1.0)


def _rows_memory_budget(rows: Rows, c: _Cells) -> None:
    """``U[t, k0] = sum_i mem[i] S[t, i] + mem[k0] R[t, k0]`` and ``U[t, k] = U[t, k'] + mem[k] R[t, k]
    - sum_i mem[i] FREE[t, i, k']``; the budget is the bound ``U <= budget - fixed`` of the U columns."""
    n, nu, u_t, u_k, u_col0, mem = c.n, c.nu, c.u_t, c.u_k, c.u_col0, c.mem
    first = np.r_[True, u_t[1:] != u_t[:-1]] if nu else np.zeros(0, dtype=bool)
    rid = rows.new(nu, 0.0, 0.0)
    rows.term(rid, u_col0 + np.arange(nu), 1.0)
    rows.term(rid, c.r_col[u_t, u_k], -mem[u_k], c.r_fixed[u_t, u_k])
    prev = ~first
    rows.term(rid[prev], (u_col0 + np.arange(nu) - 1)[prev], -1.0)
    # held values enter the first position of each stage
    row_of_stage = np.full(n, -1, dtype=np.int64)
    row_of_stage[u_t[first]] = rid[first]
    rows.term(row_of_stage[c.tt], c.s_col[c.tt, c.ii], -mem[c.ii], c.s_fixed[c.tt, c.ii])
    # a FREE after position k enters the row of the next position of its stage
    next_row = np.full((n, n), -1, dtype=np.int64)
    next_row[u_t[:-1][~first[1:]], u_k[:-1][~first[1:]]] = rid[1:][~first[1:]]
    rows.term(next_row[c.f_t, c.f_k], c.f_col, mem[c.f_i])


def _rows_residency(rows: Rows, graph: "Graph", c: _Cells, fraction: float) -> None:
    """``sum_{i < k, i not an input of k} mem[i] S[t+1, i] + W[k] R[t, k] <= cap``: while ``k`` runs in
    stage ``t``, its working set ``W[k]`` (inputs and output) and every value held into ``t + 1`` are
    resident.

    One row per stage at its own node (``k = t``, where ``R = 1``), and one at every other position
    whose working set is at least ``fraction`` of the available memory. The memory rows imply them
    for integral (R, S); with the flow rows the LP bound was unchanged by them on every graph
    measured. They are knapsacks in the binaries alone, which the solver's cover cuts need.
    """
    n, mem, cap = c.n, c.mem, c.cap
    if n < 2:
        return
    edges = c.edges
    work = mem + np.bincount(edges[:, 1], weights=mem[edges[:, 0]], minlength=n)
    stage_t = np.arange(n - 1)
    pt, pk = np.nonzero(np.tril(c.r_is_var, -1)[:n - 1] & (work >= fraction * cap)[None, :])
    row_t = np.concatenate([stage_t, pt])
    row_k = np.concatenate([stage_t, pk])
    present = c.s_is_var | c.s_fixed
    idx = np.arange(n)
    chunk = max(1, _RESIDENCY_CELLS_PER_CHUNK // n)
    for lo in range(0, row_t.size, chunk):
        t, k = row_t[lo:lo + chunk], row_k[lo:lo + chunk]
        items = (idx[None, :] < k[:, None]) & ~c.adj[:, k].T & present[t + 1]
        # rows that cannot bind (everything held and k run still fits) are left out
        reach = items @ mem + work[k]
        binding = reach > cap + 1e-9
        t, k, items = t[binding], k[binding], items[binding]
        if t.size == 0:
            continue
        p, i = np.nonzero(items)
        rid = rows.new(t.size, -np.inf, cap)
        rows.term(rid[p], c.s_col[t[p] + 1, i], mem[i], c.s_fixed[t[p] + 1, i])
        rows.term(rid, c.r_col[t, k], work[k], c.r_fixed[t, k])


# ---------------------------------------------------------------------------------- the model
def build_formulation(graph: "Graph", budget_bytes: int, *, exact_free: bool = False,
                      integral_s_only: bool = False, integral_units: bool = False,
                      exclusive_rows: bool | None = None, flow_rows: bool = True,
                      residency_rows: bool = True,
                      working_set_fraction: float | None = None) -> CheckmateFormulation:
    """Build the MILP for ``graph`` under ``budget_bytes`` (fixed bytes included in the budget).

    ``integral_s_only`` declares only S integral: for a fixed integral S the minimal R is integral
    and dominates every other R, so an optimum with integral S exists; callers re-derive R anyway.
    ``flow_rows=False`` leaves out the flow rows (the published, weaker relaxation), for comparison.
    ``residency_rows=False`` leaves out the residency rows (below); ``working_set_fraction`` chooses
    the positions that get one besides each stage's own node (default ``_WORKING_SET_FRACTION``).
    ``exclusive_rows`` (default: only with ``exact_free``) adds ``R[t, i] + S[t, i] <= 1``. Computing a
    resident value only costs, so optima never do it and the schedule read back from S never does; the
    rows leave the LP bound unchanged on every graph measured and cost about half the LP time. They
    are needed when the solver's raw (R, S) itself must be a valid schedule.
    ``integral_units`` measures memory in gcd units however large the numbers get (for solvers that
    need integral rows and do exact integer arithmetic, such as CP-SAT).

    The rows, one function per family (in this order): :func:`_rows_compute_requires_inputs`,
    :func:`_rows_retain_requires_prior`, :func:`_rows_compute_or_retain`,
    :func:`_rows_free_requires_compute`, :func:`_rows_free_at_most_once`, :func:`_rows_flow`,
    :func:`_rows_free_after_last_use`, :func:`_rows_free_definition`, :func:`_rows_memory_budget`,
    :func:`_rows_residency`.
    """
    if exclusive_rows is None:
        exclusive_rows = exact_free
    unit, mem, cap, integral = _mem_units(graph, budget_bytes, integral_units)
    c = _cells(graph, mem, cap)

    rows = Rows()
    _rows_compute_requires_inputs(rows, c)
    _rows_retain_requires_prior(rows, c, flow_rows)
    if exclusive_rows:
        _rows_compute_or_retain(rows, c)
    _rows_free_requires_compute(rows, c)
    _rows_free_at_most_once(rows, c)
    if flow_rows:
        _rows_flow(rows, c)
    _rows_free_after_last_use(rows, c, graph)
    if exact_free:
        _rows_free_definition(rows, c)
    _rows_memory_budget(rows, c)
    if residency_rows:
        frac = _WORKING_SET_FRACTION if working_set_fraction is None else float(working_set_fraction)
        _rows_residency(rows, graph, c, frac)
    num = c.num_cols
    A, row_lo, row_hi = rows.build(num)

    col_lo = np.zeros(num)
    col_hi = np.ones(num)
    col_hi[c.u_col0:] = cap
    integer = np.zeros(num, dtype=bool)
    integer[c.s_col[c.s_is_var]] = True
    if not integral_s_only:
        integer[c.r_col[c.r_is_var]] = True

    n = graph.n
    cost = graph.cost.astype(np.float64)
    positive = cost[cost > 0]
    cost_scale = float(positive.mean()) if positive.size else 1.0
    obj = np.zeros(num)
    obj[c.r_col[c.r_is_var]] = (cost[None, :] * np.ones((n, 1)))[c.r_is_var] / cost_scale
    offset = float(cost.sum()) / cost_scale   # the diagonal: every node once

    integral_rows = bool(integral and np.all(np.abs(A.data - np.round(A.data)) < 1e-9))
    step = cost_granularity(cost)
    model = SparseModel(obj, offset, A.tocsr(), row_lo, row_hi, col_lo, col_hi, integer, cost_scale, integral_rows,
                        None if step is None else step / cost_scale)
    return CheckmateFormulation(
        graph=graph, budget_bytes=int(budget_bytes), model=model, mem_unit_bytes=unit, cap_units=float(cap),
        r_col=c.r_col, s_col=c.s_col, r_fixed=c.r_fixed, s_fixed=c.s_fixed,
        free_t=c.f_t, free_i=c.f_i, free_k=c.f_k, free_col0=c.free_col0,
        u_t=c.u_t, u_k=c.u_k, u_col0=c.u_col0, exact_free=exact_free,
        stats={"R": int(c.r_is_var.sum()), "S": int(c.s_is_var.sum()), "FREE": c.nf, "U": c.nu,
               "rows": int(A.shape[0]), "nonzeros": int(A.nnz)},
    )
