"""The batched linear-assignment kernel: one program solves one problem,
all on the device, with no host read, so a launch can be captured in a CUDA
graph."""
import triton
import triton.language as tl

# NaN and +inf costs are read as COST_BOUND, -inf as -COST_BOUND (and finite
# costs are clamped to the same range): every distance stays finite, so the
# search below always ends (see the kernel's docstring).
COST_BOUND = tl.constexpr(1e30)


@triton.jit
def read_costs(ptrs, mask):
    """fp32 costs at ``ptrs`` (any float dtype), NaN read as COST_BOUND and
    everything clamped to [-COST_BOUND, COST_BOUND]; 0 where ``mask`` is
    False."""
    c = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    c = tl.where(c == c, c, COST_BOUND)
    return tl.minimum(tl.maximum(c, -COST_BOUND), COST_BOUND)


@triton.jit
def pop(dist, row4col, BLOCK_N: tl.constexpr):
    """(distance, row, its column) of the least of ``dist`` [BLOCK_N] (no
    NaN), ties going to free rows (column -1), then to the lowest row.

    One int64 min: the high word is the distance's bits made signed-ordered
    (negative floats get their 31 low bits flipped, an involution), the low
    word (matched, row, column + 1) as fields of one index each (rows and
    columns are < BLOCK_N)."""
    bits = dist.to(tl.int32, bitcast=True)
    low = ((row4col >= 0).to(tl.int32) * BLOCK_N + tl.arange(0, BLOCK_N)) * (2 * BLOCK_N)
    key = tl.min(((bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) << 32)
                 | (low + row4col + 1).to(tl.int64), 0)
    bits = (key >> 32).to(tl.int32)
    low = key.to(tl.int32)
    return ((bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True),
            (low // (2 * BLOCK_N)) % BLOCK_N, low % (2 * BLOCK_N) - 1)


@triton.jit
def linear_assignment_kernel(cost_ptr, num_cols_ptr, out_ptr, v_ptr, N, G,
                             stride_cp, stride_cn, stride_cg, stride_op, stride_og,
                             BLOCK_N: tl.constexpr):
    """out[p, j] = the row matched to column j in a minimum-cost matching of
    all columns j < num_cols[p] of cost[p] to distinct rows; -1 for the
    padding columns num_cols[p] <= j < G.

    cost (P, N, G) fp16/bf16/fp32, any strides (stride_cn == 1, i.e. a
    transposed (P, G, N) buffer, makes each column one contiguous load);
    num_cols (P,) int32/int64, clamped to [0, G]; out (P, G) int64; v (P, N)
    fp32 scratch.  N >= G (checked by the launcher), so every real column
    gets a row.  Grid: (P,), one program per problem; BLOCK_N =
    next_pow2(N) lanes, lane i being row i.  Offsets within a problem are
    int32 (the launcher checks that they fit), the problem's base int64.

    Math (shortest augmenting paths with potentials, the Jonker-Volgenant /
    Hungarian scheme with the columns as the side that is added): potentials
    u (columns) and v (rows) keep every reduced cost c[i, j] - u[j] - v[i]
    >= 0 and every matched pair's at 0, so the matching of the columns
    added so far is optimal.  Column ``cur`` is added by a Dijkstra search
    over the rows with the reduced costs as edge lengths: scan column j (all
    rows at once: one [BLOCK_N] load), lowering shortest[i] to
    dist + c[i, j] - u[j] - v[i]; pop the unvisited row of least shortest[i]
    (one int64 tl.min, see pop); if it is free it is the sink, else go on
    from the column it is matched to, at dist = shortest[row].  Then
    v[i] -= dist - shortest[i] on the visited rows (u changes too,
    implicitly: below), which keeps the invariants, and the path
    sink <- ... <- cur is flipped.  Rows are many and mostly free, so a
    search pops few rows.

    u is never stored: a matched pair (i, j) has reduced cost 0, so
    u[j] = c[i, j] - v[i], read when the search reaches j through its row i
    (two scalar loads beside the column's); a column not yet added has
    u = 0.  Ties in the pop go to a free row (it ends the search), then to
    the lowest row index.

    Scratch memory: the [BLOCK_N] vectors (v, shortest, via, row4col,
    visited) live in registers, at most 8 rows a thread at the launcher's
    warp count; v is also kept in the v scratch (zeros first, stored again
    whenever a search changes it, each store followed by a barrier), so
    that a step reads the popped row's potential by a scalar load instead
    of a second reduction over the lanes.

    Loops and their bounds:
    - ``for cur in range(num_cols)``: one search per real column, in order.
    - the search (``while sink < 0``): each step visits a new row, since the
      pop reads only unvisited rows (visited and padding lanes >= N have key
      +inf, above every finite distance); at most cur rows are matched and
      N > cur, so a free row is popped within cur + 1 steps.  Distances are
      finite: costs are read in [-COST_BOUND, COST_BOUND], a free row keeps
      every potential within 2 * COST_BOUND of 0, and a distance is at most
      (2 * G + 5) * COST_BOUND, far inside fp32's range.
    - the flip (``while row >= 0``): follows each row's predecessor (the
      row whose column last lowered its distance, -1 for column cur), each
      popped before the row itself, so it ends, after at most cur + 1 rows.
      A search of one step (the usual case) skips it and the v update: its
      path is the sink and cur, and its v update is zero.

    Bound checks: lanes >= N (padding of the power-of-two block) are masked
    out of the column loads and the v stores and never popped; the scalar
    loads of u's cost and v are masked when the popped row is free (its
    column is -1, and the search ends); the stores write each matched
    row's index at its column and -1 on the lanes num_cols[p] <= j < G only
    (G <= N <= BLOCK_N), two disjoint sets of columns.

    Non-finite costs: NaN is +inf, and +inf is read as COST_BOUND (-inf as
    -COST_BOUND).  A problem with an assignment of finite cost is solved
    exactly (a search pops a row at distance >= COST_BOUND only when no
    finite augmenting path exists); any other problem, all-inf included,
    still gets a full valid matching, optimal for the costs as read up to
    fp32 rounding at COST_BOUND's magnitude.
    """
    p = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, BLOCK_N)
    is_row = lane < N
    problem = cost_ptr + p * stride_cp
    row_offs = lane * stride_cn
    v_row_ptr = v_ptr + p * N
    num_cols = tl.minimum(tl.maximum(tl.load(num_cols_ptr + p), 0), G).to(tl.int32)

    v = tl.zeros([BLOCK_N], tl.float32)
    tl.store(v_row_ptr + lane, v, mask=is_row)
    tl.debug_barrier()  # the searches' scalar loads read other threads' stores
    row4col = tl.full([BLOCK_N], -1, tl.int32)  # each row's column, -1 if free
    for cur in range(0, num_cols):
        shortest = tl.full([BLOCK_N], float("inf"), tl.float32)
        # How the search reached each row: via_col * 2 * BLOCK_N + via_row + 1,
        # via_col the column scanned and via_row its row (-1 for column cur).
        via = tl.zeros([BLOCK_N], tl.int32)
        visited = lane < 0
        dist = tl.zeros([], tl.float32)
        col = cur
        col_row = tl.full([], -1, tl.int32)
        u_col = tl.zeros([], tl.float32)
        sink = tl.full([], -1, tl.int32)
        steps = 0
        while sink < 0:
            steps += 1
            c = read_costs(problem + (row_offs + col * stride_cg), is_row)
            reach = dist + (c - u_col) - v
            open_row = is_row & ~visited
            better = open_row & (reach < shortest)
            shortest = tl.where(better, reach, shortest)
            via = tl.where(better, col * (2 * BLOCK_N) + col_row + 1, via)
            dist, row, next_col = pop(tl.where(open_row, shortest, float("inf")), row4col,
                                      BLOCK_N)
            visited = visited | (lane == row)
            matched = next_col >= 0
            sink = tl.where(matched, -1, row)
            # u of the next column, by its matched pair's zero reduced cost.
            c_row = read_costs(problem + (row * stride_cn + next_col * stride_cg), matched)
            u_col = c_row - tl.load(v_row_ptr + row, mask=matched, other=0.0)
            col = next_col
            col_row = row
        if steps == 1:
            # The search popped a free row at once: the path is (sink, cur),
            # and v[sink] -= dist - shortest[sink] = 0 changes nothing.
            row4col = tl.where(lane == sink, cur, row4col)
        else:
            v = tl.where(visited, v - (dist - shortest), v)
            tl.store(v_row_ptr + lane, v, mask=is_row)
            tl.debug_barrier()
            row = sink
            while row >= 0:
                at = lane == row
                path = tl.sum(tl.where(at, via, 0), 0)
                row4col = tl.where(at, path // (2 * BLOCK_N), row4col)
                row = path % (2 * BLOCK_N) - 1

    out = out_ptr + p * stride_op
    tl.store(out + row4col * stride_og, lane.to(tl.int64), mask=row4col >= 0)
    tl.store(out + lane * stride_og, tl.full([BLOCK_N], -1, tl.int64),
             mask=(lane >= num_cols) & (lane < G))
