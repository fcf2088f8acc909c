"""linear_assignment on CPU tensors, the kernel in Triton's interpreter:
scipy's total cost on small problems of every kind (ties, G == N, padding
columns, +inf and NaN entries, half types, strided views), a valid matching
where scipy has none, and clear errors for bad input."""
import pytest
import torch

from msda_mm.ops.linear_assignment import linear_assignment, linear_assignment_reference
from msda_mm.ops.linear_assignment.validate import MAX_ROWS

from assignment_checks import assert_optimal, assert_valid_matching

P = 6
G_CAP = 8


def _problems(N: int, seed: int):
    """(cost (P, N, G), num_cols (P,) int32), G = min(G_CAP, N), problem p
    of kind p % 3: uniform costs; integers 0..3 (many ties); rows of one
    quality for every column plus noise (as DETR's queries: the columns
    compete for the same rows, so searches are long).  Counts 0, G and
    random ones."""
    gen = torch.Generator().manual_seed(seed)
    G = min(G_CAP, N)
    cost = torch.rand(P, N, G, generator=gen)
    cost[1::3] = torch.randint(0, 4, (P // 3, N, G), generator=gen).float()
    cost[2::3] += 3 * torch.rand(P // 3, N, 1, generator=gen)
    num_cols = torch.randint(0, G + 1, (P,), generator=gen, dtype=torch.int32)
    num_cols[:4] = torch.tensor([G, G, G, 0])
    return cost, num_cols


@pytest.mark.parametrize("N", [1, 5, 16, 33])
def test_total_cost_is_scipys(N):
    """N = 1 and 5 have G == N (every row taken when num_cols = G)."""
    cost, num_cols = _problems(N, seed=N)
    assert_optimal(cost, num_cols, linear_assignment(cost, num_cols))


def _with_blocked_entries(cost, fill, fraction, seed):
    """``fill`` on ``fraction`` of the entries, except a random matching of
    every column, so that every problem keeps a finite assignment."""
    gen = torch.Generator().manual_seed(seed)
    P, N, G = cost.shape
    blocked = torch.rand(cost.shape, generator=gen) < fraction
    for p in range(P):
        blocked[p, torch.randperm(N, generator=gen)[:G], torch.arange(G)] = False
    return cost.masked_fill(blocked, fill)


def test_inf_entries_are_avoided():
    cost, num_cols = _problems(16, seed=1)
    cost = _with_blocked_entries(cost, float("inf"), 0.7, seed=2)
    assert_optimal(cost, num_cols, linear_assignment(cost, num_cols))


def test_nan_entries_count_as_inf():
    cost, num_cols = _problems(16, seed=3)
    cost = _with_blocked_entries(cost, float("nan"), 0.7, seed=4)
    out = linear_assignment(cost, num_cols)
    assert_optimal(cost.nan_to_num(nan=float("inf")), num_cols, out)


def test_problems_without_finite_assignment_still_get_a_full_matching():
    """scipy refuses these; the kernel returns a valid matching of every real
    column (all-inf, all-NaN, two columns finite on one row only, -inf) and
    solves the finite problem beside them."""
    cost, num_cols = _problems(5, seed=5)
    num_cols[:] = 5
    cost[0] = float("inf")
    cost[1] = float("nan")
    cost[2] = float("inf")
    cost[2, 3, :2] = 1.0
    cost[3, :, 4] = -float("inf")
    with pytest.raises(ValueError):
        linear_assignment_reference(cost[:1], num_cols[:1])
    out = linear_assignment(cost, num_cols)
    assert_valid_matching(cost, num_cols, out)
    assert_optimal(cost[4:], num_cols[4:], out[4:])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_are_solved_on_their_values(dtype):
    """Negative costs of magnitude 1e3 too; scipy solves the upcast values."""
    cost, num_cols = _problems(16, seed=6)
    cost = ((cost - 0.5) * 2000).to(dtype)
    assert_optimal(cost, num_cols, linear_assignment(cost, num_cols))


def test_strided_cost_and_int64_counts_out_of_range():
    """A (P, G, N) buffer's transposed view (stride 1 along the rows) and
    int64 counts past [0, G], which are clamped."""
    cost, _ = _problems(33, seed=7)
    cost = cost.transpose(1, 2).contiguous().transpose(1, 2)
    assert cost.stride(1) == 1
    num_cols = torch.tensor([-3, 0, 4, G_CAP, G_CAP + 5, 1])
    out = linear_assignment(cost, num_cols)
    assert (out[0] == -1).all() and (out[4] >= 0).all()
    assert_optimal(cost, num_cols, out)


@pytest.mark.parametrize("shape", [(0, 5, 3), (4, 5, 0), (3, 0, 0)])
def test_empty_problems(shape):
    cost = torch.rand(shape)
    out = linear_assignment(cost, torch.zeros(shape[0], dtype=torch.int32))
    assert out.shape == (shape[0], shape[2]) and out.dtype == torch.int64


def test_reference_format():
    cost = torch.tensor([[[5.0, 1.0, 7.0], [1.0, 5.0, 7.0], [3.0, 3.0, 0.0], [9.0, 9.0, 9.0]]])
    out = linear_assignment_reference(cost, torch.tensor([2], dtype=torch.int32))
    assert out.tolist() == [[1, 0, -1]] and out.dtype == torch.int64


COST = torch.rand(2, 5, 3)
COUNTS = torch.tensor([3, 1], dtype=torch.int32)
CASES = [
    # (cost, num_cols, exception, words the message must contain)
    (COST.numpy(), COUNTS, TypeError, ["cost", "ndarray"]),
    (COST, [3, 1], TypeError, ["num_cols", "list"]),
    (COST.double(), COUNTS, TypeError, ["cost", "float64"]),
    (COST.long(), COUNTS, TypeError, ["cost", "int64"]),
    (COST, COUNTS.float(), TypeError, ["num_cols", "float32"]),
    (COST[0], COUNTS, ValueError, ["cost", "(P, N, G)", "(5, 3)"]),
    (COST.transpose(1, 2), COUNTS, ValueError, ["N >= G", "N=3", "G=5"]),
    (torch.rand(1, MAX_ROWS + 1, 2), COUNTS[:1], ValueError, ["cost", f"{MAX_ROWS + 1}"]),
    (COST, COUNTS[:1], ValueError, ["num_cols", "(2,)", "(1,)"]),
    (COST, COUNTS[:, None], ValueError, ["num_cols", "(2, 1)"]),
    (COST, COUNTS.to("meta"), ValueError, ["num_cols", "meta", "cpu"]),
    (COST.to("meta"), COUNTS.to("meta"), ValueError, ["cost", "meta", "TRITON_INTERPRET"]),
]


@pytest.mark.parametrize("cost, num_cols, exc, words", CASES)
def test_bad_input_names_the_argument(cost, num_cols, exc, words):
    with pytest.raises(exc) as info:
        linear_assignment(cost, num_cols)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        linear_assignment(COST, COUNTS)


def test_offsets_past_int32_are_refused():
    huge = torch.empty_strided((1, 3, 2), (6, 2**30, 1), device="meta")
    with pytest.raises(ValueError, match="2\\*\\*31"):
        linear_assignment(huge, COUNTS[:1].to("meta"))
