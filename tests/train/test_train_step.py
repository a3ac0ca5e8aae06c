"""The jitted train step on 8 fake CPU devices: sharded meshes equal one device; accumulation equals one
large batch; LoRA mode trains (and keeps optimizer state for) the adapters only."""

import dataclasses

import jax
import numpy as np
import pytest

from memllm_jax.config import TINY, LoraConfig, MeshConfig
from memllm_jax.model.placement import create_model
from memllm_jax.sharding import make_mesh
from memllm_jax.train import step as S
from memllm_jax.train.config import TrainConfig, resume_conflicts, validate
from memllm_jax.train.optimizer import lora_b_mask, make_optimizer

# Adam's first update is lr * g / (|g| + eps): gradient entries at float-noise level may flip sign between
# reduction orders, so parameter agreement is bounded by ~lr. lr=1e-4 keeps it within the 1e-5 goal while
# the loss and the gradients themselves are compared directly.
CFG = TrainConfig(train_data=("unused",), tokenizer="unused", lr=1e-4, weight_decay=0.1, clip_norm=1.0)


def random_batch(M, b, L, seed=0, vocab=TINY.vocab_size):
    r = np.random.default_rng(seed)
    lengths = r.integers(L // 2, L + 1, (M, b))
    real = np.arange(L)[None, None] < lengths[..., None]
    return dict(
        inputs=r.integers(0, vocab, (M, b, L)).astype(np.int32),
        targets=r.integers(0, vocab, (M, b, L)).astype(np.int32),
        loss_mask=real & (r.random((M, b, L)) < 0.5),
        attn_mask=real,
        positions=np.broadcast_to(np.arange(L, dtype=np.int32), (M, b, L)).copy(),
    )


def one_step(mesh_shape, batch, mode="full", lora=None, model_cfg=TINY, cfg=CFG):
    devices = jax.devices()[: int(np.prod(mesh_shape))]
    mesh = make_mesh(MeshConfig(*mesh_shape), devices)
    model = create_model(model_cfg, lora, mesh, 0)
    split = S.split_model(model, mode)
    tx = make_optimizer(cfg, 10)
    shardings = S.train_state_shardings(split, tx, mesh)
    state = S.init_train_state(split, tx, shardings)
    frozen_before = jax.tree.map(np.asarray, split.frozen)
    step = S.make_train_step(split, tx, mesh, shardings, return_grads=True)
    state, metrics = step(state, split.frozen, S.to_global(batch, mesh))
    state = state.replace(rngs=None)  # PRNG keys are not numpy-convertible
    return jax.tree.map(np.asarray, state), jax.tree.map(np.asarray, metrics), split, frozen_before


def max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.slow
def test_meshes_equal_one_device():
    batch = random_batch(1, 8, 32)
    ref_state, ref_m, _, _ = one_step((1, 1, 1), batch)
    for shape in [(8, 1, 1), (2, 2, 2), (1, 4, 2)]:
        state, m, _, _ = one_step(shape, batch)
        assert abs(m["loss"] - ref_m["loss"]) <= 1e-5, shape
        assert m["loss_tokens"] == ref_m["loss_tokens"] == batch["loss_mask"].sum()
        assert max_diff(m["grads"], ref_m["grads"]) <= 1e-5, shape
        assert max_diff(state.params, ref_state.params) <= 1e-5, shape
        assert max_diff(state.params, jax.tree.map(np.zeros_like, state.params)) > 0


@pytest.mark.slow
def test_bfloat16_matmuls_shard_like_one_device_and_track_float32():
    """`matmul_dtype="bfloat16"` (custom-VJP matmuls, the weight gradient over token chunks) on sharded meshes:
    the same loss and gradients as on one device, and close to the float32 step's."""
    import dataclasses

    cfg16 = dataclasses.replace(TINY, matmul_dtype="bfloat16")
    batch = random_batch(1, 8, 32, seed=7)
    _, m32, _, _ = one_step((1, 1, 1), batch)
    _, ref, _, _ = one_step((1, 1, 1), batch, model_cfg=cfg16)
    assert 0 < abs(ref["loss"] - m32["loss"]) <= 1e-2 * abs(m32["loss"])
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(m32["grads"]))
    assert max_diff(ref["grads"], m32["grads"]) <= 0.05 * scale
    for shape in [(8, 1, 1), (2, 2, 2)]:
        _, m, _, _ = one_step(shape, batch, model_cfg=cfg16)
        assert abs(m["loss"] - ref["loss"]) <= 1e-5 * abs(ref["loss"]), shape
        # cotangents are rounded to bf16 after sums whose order depends on the mesh: agreement to one bf16 ulp at
        # the gradients' largest magnitude (2^-7 relative; a float32-only EPYC measured 3.2e-3 on the 8-device mesh)
        assert max_diff(m["grads"], ref["grads"]) <= 2.0 ** -7 * scale, shape


@pytest.mark.slow
def test_accumulation_equals_large_batch():
    big = random_batch(1, 32, 32, seed=3)
    micro = {k: v.reshape(4, 8, 32) for k, v in big.items()}
    s1, m1, _, _ = one_step((2, 2, 2), big)
    s4, m4, _, _ = one_step((2, 2, 2), micro)
    assert abs(m1["loss"] - m4["loss"]) <= 1e-5
    assert max_diff(m1["grads"], m4["grads"]) <= 1e-5
    assert max_diff(s1.params, s4.params) <= 1e-5
    # per-micro-batch normalisation would differ: the loss-token counts of the micro-batches are unequal
    assert len({int(micro["loss_mask"][i].sum()) for i in range(4)}) > 1


@pytest.mark.slow
def test_lora_mode_trains_adapters_only():
    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.1)
    state, m, split, frozen_before = one_step((2, 2, 2), random_batch(1, 8, 32, seed=5), mode="lora", lora=lora)
    from flax import nnx

    lora_leaves = jax.tree.leaves(split.params)
    assert all(isinstance(v, nnx.LoRAParam) for v in jax.tree.leaves(split.params, is_leaf=lambda x: isinstance(x, nnx.Variable)))
    n_lora = sum(x.size for x in lora_leaves)
    n_opt = sum(x.size for x in jax.tree.leaves(state.opt_state))
    assert n_opt <= 2 * n_lora + 8  # Adam moments of the adapters plus scalar counters, nothing for the base
    # B starts at zero, so step 1 moves B (A's gradient is zero); the frozen base is untouched
    b_norm = sum(float(np.abs(x).sum()) for p, x in jax.tree_util.tree_leaves_with_path(state.params) if "'b'" in jax.tree_util.keystr(p))
    assert b_norm > 0
    assert max_diff(jax.tree.map(np.asarray, split.frozen), frozen_before) == 0
    assert np.isfinite(m["loss"])


@pytest.mark.slow
def test_lora_plus_scales_the_b_matrices_updates_only():
    """LoRA+: with `lora_b_lr_ratio` r, step 1 moves every B matrix r times as far (B starts at zero, so its
    whole value is the update) and leaves the A matrices and the trained token rows as plain LoRA does."""
    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.0, trainable_tokens=(3, 5))
    batch = random_batch(1, 8, 32, seed=6)
    plain, _, split, _ = one_step((2, 2, 2), batch, mode="lora", lora=lora)
    plus, _, _, _ = one_step((2, 2, 2), batch, mode="lora", lora=lora,
                             cfg=dataclasses.replace(CFG, mode="lora", lora=lora, lora_b_lr_ratio=4.0))
    names = {jax.tree_util.keystr(p): p for p, _ in jax.tree_util.tree_leaves_with_path(plain.params)}
    is_b = dict(zip(names, jax.tree.leaves(lora_b_mask(split.params))))
    assert sum(is_b.values()) == sum(k.endswith("['lora']['a'].value") for k in names) > 0  # one B per A
    assert any("delta" in k for k in names) and not any(is_b[k] for k in names if "delta" in k)
    plain_leaves = dict(zip(names, jax.tree.leaves(plain.params)))
    plus_leaves = dict(zip(names, jax.tree.leaves(plus.params)))
    for name in names:
        if is_b[name]:
            assert np.abs(plain_leaves[name]).max() > 0, name
            np.testing.assert_allclose(plus_leaves[name], 4.0 * plain_leaves[name], rtol=1e-5, atol=1e-9, err_msg=name)
        else:
            np.testing.assert_array_equal(plus_leaves[name], plain_leaves[name], err_msg=name)


def test_lora_plus_ratio_is_checked():
    lora = LoraConfig(rank=4)
    for ratio, mode, words in ((0.0, "lora", "> 0"), (float("nan"), "lora", "finite"), (4.0, "full", "mode")):
        cfg = dataclasses.replace(CFG, mode=mode, lora=lora, lora_b_lr_ratio=ratio)
        with pytest.raises(ValueError, match=rf"setting lora_b_lr_ratio=.*{words}"):
            validate(cfg)


def test_a_run_saved_before_lora_plus_resumes_as_plain_lora():
    saved = dataclasses.asdict(CFG)
    del saved["lora_b_lr_ratio"]  # a train_config.json written before the setting existed
    assert resume_conflicts(saved, CFG) == []
    assert resume_conflicts(saved, dataclasses.replace(CFG, lora_b_lr_ratio=16.0)) == ["lora_b_lr_ratio=1.0 -> 16.0"]


def with_head_fields(batch, groups):
    """The batch plus `head_index` / `head_valid` for `groups` groups of rows (`train.data.head_positions`)."""
    from memllm_jax.train.data import head_positions

    M, R, L = batch["loss_mask"].shape
    per_group = batch["loss_mask"].reshape(M, groups, -1).sum(-1).max()
    index, valid = head_positions(batch["loss_mask"], groups, int(per_group) + 3)  # a little padding too
    return {**batch, "head_index": index, "head_valid": valid}


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", [(1, 1, 1), (2, 2, 2)])
def test_head_at_loss_positions_equals_full_logits(mesh_shape):
    """`train.step.HEAD_FIELDS`: the LM head at the gathered loss positions gives the full-logits step's loss,
    gradients and update (LoRA on every target, trained marker rows of the tied head, micro-batches)."""
    import dataclasses

    tied = dataclasses.replace(TINY, tie_embeddings=True)
    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.0, trainable_tokens=(3, 7, 11))
    batch = random_batch(2, 8, 32, seed=7)
    batch["targets"][..., :4] = 7  # a trained marker row among the targets

    def run(b):
        devices = jax.devices()[: int(np.prod(mesh_shape))]
        mesh = make_mesh(MeshConfig(*mesh_shape), devices)
        split = S.split_model(create_model(tied, lora, mesh, 0), "lora")
        tx = make_optimizer(CFG, 10)
        sh = S.train_state_shardings(split, tx, mesh)
        state, m = S.make_train_step(split, tx, mesh, sh, return_grads=True)(
            S.init_train_state(split, tx, sh), split.frozen, S.to_global(b, mesh))
        evaluate = S.make_eval_step(split, mesh, sh)
        e = evaluate(state.params, state.rngs, split.frozen, S.to_global({k: v[0] for k, v in b.items()}, mesh, micro=False))
        return jax.tree.map(np.asarray, state.replace(rngs=None)), jax.tree.map(np.asarray, m), [float(x) for x in e]

    dp = mesh_shape[0] * mesh_shape[1]
    full_state, full_m, full_e = run(batch)
    sparse_state, sparse_m, sparse_e = run(with_head_fields(batch, dp))
    assert abs(full_m["loss"] - sparse_m["loss"]) <= 1e-5 and full_m["loss_tokens"] == sparse_m["loss_tokens"]
    assert max_diff(full_m["grads"], sparse_m["grads"]) <= 1e-5
    assert max_diff(full_state.params, sparse_state.params) <= 1e-5
    assert abs(full_e[0] - sparse_e[0]) <= 1e-6 * full_e[0] and full_e[1] == sparse_e[1] == batch["loss_mask"][0].sum()
    # the gather really selects: a batch whose head positions miss one loss token gives another loss
    broken = with_head_fields(batch, dp)
    broken["head_valid"][0, 0, 0] = False
    assert abs(run(broken)[1]["loss"] - full_m["loss"]) > 1e-4


@pytest.mark.slow
def test_prefix_packed_step_equals_example_packed_step(tmp_path):
    """The same examples in one global batch, packed whole ("pack_examples") or as trunks and branches
    ("pack_prefixes"), give the same loss, gradients and update on a sharded mesh with the LM head at the loss
    positions: the prefix fields reach the model through `to_global` and `batch_loss`."""
    import dataclasses

    from memllm_jax.train import data as D
    from tests.support.train_fixtures import document_write_records, make_tokenizer, write_jsonl

    tok = make_tokenizer(tmp_path / "tok")
    corpus = D.load_corpus([write_jsonl(tmp_path / "w.jsonl", document_write_records(3))], tok, seq_len=256)
    model_cfg = dataclasses.replace(TINY, vocab_size=max(TINY.vocab_size, tok.vocab_size))
    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.0)
    mesh_shape = (2, 2, 2)
    dp = mesh_shape[0] * mesh_shape[1]

    def run(packing):
        planner = D.Planner(corpus, seq_len=256, global_batch=8, packing=packing, seed=0, drop_last=False)
        assert planner.batches_per_epoch == 1  # every example in the one batch
        batch = D.materialize(planner.plan(0), corpus, pad_id=tok.pad_id, micro_batches=2, head_groups=dp)
        mesh = make_mesh(MeshConfig(*mesh_shape), jax.devices()[:8])
        split = S.split_model(create_model(model_cfg, lora, mesh, 0), "lora")
        tx = make_optimizer(CFG, 10)
        sh = S.train_state_shardings(split, tx, mesh)
        state, m = S.make_train_step(split, tx, mesh, sh, return_grads=True)(
            S.init_train_state(split, tx, sh), split.frozen, S.to_global(batch, mesh))
        return jax.tree.map(np.asarray, state.replace(rngs=None)), jax.tree.map(np.asarray, m), batch

    whole_state, whole_m, whole_b = run("pack_examples")
    tree_state, tree_m, tree_b = run("pack_prefixes")
    assert tree_b["attn_mask"].sum() < 0.8 * whole_b["attn_mask"].sum()  # fewer tokens computed
    assert tree_m["loss_tokens"] == whole_m["loss_tokens"]
    assert abs(tree_m["loss"] - whole_m["loss"]) <= 1e-5
    assert max_diff(tree_m["grads"], whole_m["grads"]) <= 1e-5
    assert max_diff(tree_state.params, whole_state.params) <= 1e-5
