"""Speculative decoding policy: drafts, per-row acceptance, step cost, rollback.

Why: editors and coding agents mostly ask for text that is already in the
prompt (rewrite this function with one fix). A decode step that also checks
k drafted tokens costs far less than k steps (every weight is streamed once
per step, whatever the number of positions), so each accepted draft token is
nearly free. This package decides *what* to draft and *how much*; the
scheduler reserves the slots, the runner verifies the drafts in the one
forward of the step and keeps the longest prefix the model's own draws
agree with (runner.py, sampling.py rule 4).
Where things are: lookup.py (one row's n-gram index and acceptance),
cost.py (the step cost model), speculator.py (plans and settles drafts),
model.py (the draft model's forwards: the one module here that imports MLX,
imported by the runner only, so the scheduler stays integers).

Rules:
1. Drafts come from prompt lookup (n-gram): the row's last n tokens (n from
   `ngram_max` down to 2) are looked up in the row's own prompt + output; the
   first occurrence at or after the row's cursor (where its last accepted
   lookup draft ended: the text it is copying) proposes the tokens that
   followed it, else the most recent one. So after the model departs from the
   copied text (an edit renames an identifier) the copy picks up right after
   the departure, not at a later repeat of the same words. An index of every
   n-gram's end positions (ascending) is kept per row and grows with the row,
   so a lookup is O(ngram_max log n), not a scan of the context.
2. Each row keeps an exponential average `alpha` of its acceptance rate
   (accepted / drafted), one per draft source. A row whose drafts keep
   failing (alpha below `COLD_ALPHA`) drafts nothing from that source, except
   one probe every `PROBE_EVERY` steps, so a row that starts quoting its
   prompt again is noticed. A new row's averages start from the engine's
   recent acceptance over all rows (per source), so a workload that never
   quotes its prompt (free chat) does not pay a warm-up of failed drafts
   per request, and one that does (edits) drafts from its first step.
3. The step cost model: a step of B rows each with L positions (decode rows
   are padded to the longest verify row, and every row attends as far as the
   longest row reaches, T tokens) costs about
   c0 + c1 * B * L + c2 * B * L * T / 1000. The ratios c1 / c0 and c2 / c0
   start from a prior (the 2-core CPU backend's engine steps,
   benchmarks/results/spec_cost_bench-*.txt) and are refitted from the steps
   the engine times (decayed least squares with the prior as pseudo-steps
   over the widths and contexts planned, cost.py: wall-clock noise, a
   stalled step on a loaded machine, moves a slope the steps do not span
   little, so it never switches speculation off by itself). The step's L
   is the one that maximises expected tokens per unit of cost,
   sum_i E_i(min(L - 1, draft_i)) / cost(L) [+ draft cost, rule 7], with
   E(k) = 1 + alpha + ... + alpha^k the expected tokens of a row drafting k.
   L = 1 (plain decode) is always a candidate, so speculation
   is chosen only when it is expected to pay for itself.
4. Pipelined engines (Metal, loop.py) plan step t+1 before step t's tokens
   are on the host, and a row can only draft from tokens the host knows. So
   the loop reads a step back before planning the next whenever one of its
   rows `expects_draft` (warm, and its recent lookups found matches, or a
   warm draft model); rows that keep missing let the pipeline run, probing
   now and then.
5. A step decoding more than `max_rows` rows (setting `spec_max_rows`, 8)
   drafts nothing and never forces a read-back; up to there rule 3 decides.
   With many rows the forward is no longer bound by streaming the weights,
   so extra verify positions cost more of what they earn: rule 3 prices
   that, and speculates only where the rows' recent acceptance pays for it
   (benchmarks/results/spec-notes.md). The draft model keeps KV for fewer
   rows (`spec_draft_rows`, rule 7): its pool is full contexts.
6. Verification is the same whoever drafted: the drafts are a point mass
   (prompt lookup copies, the draft model takes its argmax), so sampling.py
   rule 4 keeps the target distribution, and greedy rows give exactly the
   tokens plain decoding gives.
7. The draft model (registry `draft = "name"`, loaded with its target's
   generation, same tokenizer): a row drafts by prompt lookup when its
   suffix matches (free, and on quoted text more often right), else by the
   draft model when that source is warm (rule 2). The draft model has its
   own paged KV (`draft_kv`, a second, small pool of the same block size,
   no prefix cache): each step, a drafting row first feeds the tokens its
   draft KV lacks (the whole prompt the first time, at most
   `draft_chunk_tokens` per step: a longer backlog is a catch-up-only step
   without drafts), then drafts k = L - 1 tokens greedily, batched across
   rows (model.py). After verification its draft KV is trimmed to the
   longest prefix of what it was fed that the row kept, so it never holds
   a rejected token. A row that ends or is preempted frees its draft KV;
   when the pool is short, rows not drafting this step give theirs back.
   The cost model adds the draft's L - 1 sequential steps, each priced at
   `draft_step_cost` (draft weights / target weights, set by the engine).
8. Recurrent layers (kv/specs.py) fold every verified position into the
   row's state, rejected drafts too, and no model file gives the state after
   each position. So a verify row keeps its pre-verify state (the runner
   checkpoints its slot; a reference, nothing is copied) and a recurrent
   model's decode call runs one call per verify width (never padded,
   kv/recurrent.py rule 4). A row that kept all its drafts goes on from the
   verify's state; one that rejected some is rolled back: its slot returns
   to the checkpoint and its kept tokens (the verify's input, the accepted
   drafts and the token after them) run as one prefill chunk from there,
   whose last position samples the next token, exactly as plain decoding
   would have. Its K/V for those positions is written again, the same. A
   draft model with recurrent layers is not used (its own KV is paged only).
"""

from ..plan import DraftJob
from .cost import PRIOR_COST_RATIO, StepCostModel
from .lookup import COLD_ALPHA, PROBE_EVERY, RowDrafter
from .speculator import SpecConfig, Speculator

__all__ = ["COLD_ALPHA", "PRIOR_COST_RATIO", "PROBE_EVERY", "DraftJob", "RowDrafter",
           "SpecConfig", "Speculator", "StepCostModel"]
