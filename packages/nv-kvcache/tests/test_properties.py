"""Property test: random add / schedule+postprocess / abort / finish; invariants after every step,
exact outputs for sequences that finished by themselves, no block left in use at the end."""
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from nv_kvcache import FinishReason, Scheduler, Sequence, StopRules
from nv_kvcache.testing import FakeModel, check_invariants, check_scheduled, reference_output, run_to_completion

PREFIXES = [[], [1, 2, 3, 4, 5, 0, 1, 2, 3], [1, 2, 3, 4, 5, 5, 5], [0] * 12]
VOCAB = 6
EOS = 5


def scheduler_state(sched: Scheduler) -> tuple:
    bm = sched.block_manager
    return ([s.seq_id for s in sched.waiting], [s.seq_id for s in sched.running], sorted(sched._seqs),
            bm.free_block_ids(), [bm.ref_count(b) for b in range(bm.num_blocks)], bm.num_cached_blocks)


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(block_size=st.sampled_from([1, 2, 3, 4, 8]), cache_tokens=st.integers(8, 64),
                max_num_seqs=st.integers(1, 6), budget=st.integers(1, 24), max_model_len=st.integers(4, 40),
                caching=st.booleans(), model_seed=st.integers(0, 3))
    def setup(self, block_size, cache_tokens, max_num_seqs, budget, max_model_len, caching, model_seed):
        num_blocks = -(-cache_tokens // block_size)       # small caches, so that preemption happens
        self.sched = Scheduler(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=budget, max_model_len=max_model_len,
                               enable_prefix_caching=caching)
        self.model = FakeModel(vocab_size=VOCAB, seed=model_seed)
        self.seqs: list[Sequence] = []
        self.interrupted: set[int] = set()      # aborted / finished from outside: no reference output

    requests = st.lists(st.tuples(
        st.sampled_from(PREFIXES), st.lists(st.integers(0, VOCAB - 1), max_size=10),   # prompt
        st.integers(1, 16), st.integers(0, 3), st.booleans(),                          # max, min, ignore_eos
        st.sampled_from([frozenset(), frozenset({4}), frozenset({3, 4})])), min_size=1, max_size=4)

    @rule(requests=requests)
    def add(self, requests):
        for prefix, suffix, max_tokens, min_tokens, ignore_eos, stop_ids in requests:
            rules = StopRules(max_tokens=max_tokens, min_tokens=min(min_tokens, max_tokens),
                              ignore_eos=ignore_eos, eos_token_ids={EOS}, stop_token_ids=stop_ids)
            self.add_one(Sequence(prefix + suffix, rules))

    def add_one(self, seq: Sequence) -> None:
        sched = self.sched
        before = scheduler_state(sched)
        try:
            sched.add(seq)
        except ValueError:
            bm = sched.block_manager
            too_long = seq.num_prompt_tokens > sched.max_model_len
            most = min(seq.num_prompt_tokens + seq.rules.max_tokens, sched.max_model_len)
            assert seq.num_prompt_tokens == 0 or too_long or bm.cdiv_blocks(most) > bm.num_blocks
            assert scheduler_state(sched) == before
            return
        self.seqs.append(seq)

    @rule(num_steps=st.integers(1, 4), abort_index=st.one_of(st.none(), st.integers(0, 7)))
    def steps(self, num_steps, abort_index):
        for _ in range(num_steps - 1):
            self.step(None)
        self.step(abort_index)

    def step(self, abort_index):
        out = self.sched.schedule()
        check_scheduled(self.sched, out)
        sampled = self.model.step(out)
        if out.preempted:
            event("preempted")
        if any(s.seq.num_cached_tokens for s in out.scheduled):
            event("prefix hit")
        if abort_index is not None and out.scheduled:   # an abort arriving while the step runs
            seq = out.scheduled[abort_index % len(out.scheduled)].seq
            self.sched.abort(seq.seq_id)
            self.interrupted.add(seq.seq_id)
        for seq in self.sched.postprocess(out, sampled):
            assert seq.block_table == [] and seq.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)

    @rule(index=st.integers(0, 50), as_abort=st.booleans())
    def stop_from_outside(self, index, as_abort):
        if not self.seqs:
            return
        seq = self.seqs[index % len(self.seqs)]
        was_unfinished = not seq.is_finished
        result = self.sched.abort(seq.seq_id) if as_abort else self.sched.finish(seq.seq_id)
        assert (result is seq) == was_unfinished
        if was_unfinished:
            self.interrupted.add(seq.seq_id)
            assert seq.block_table == []

    @invariant()
    def consistent(self):
        if hasattr(self, "sched"):
            check_invariants(self.sched)

    def teardown(self):
        if not hasattr(self, "sched"):
            return
        run_to_completion(self.sched, self.model, max_steps=10_000, check=True)
        if self.sched.num_preemptions:
            event("preempted (whole run)")
        bm = self.sched.block_manager
        assert bm.num_free_blocks == bm.num_blocks and bm.num_used_blocks == 0
        assert not self.sched.has_unfinished() and self.sched.num_running == self.sched.num_waiting == 0
        for seq in self.seqs:
            assert seq.is_finished and seq.block_table == []
            if seq.seq_id not in self.interrupted:
                expected = reference_output(seq.prompt_token_ids, self.model, seq.rules, self.sched.max_model_len)
                assert (seq.output_token_ids, seq.finish_reason) == expected, seq


SchedulerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestScheduler = SchedulerMachine.TestCase
