"""The unpadded pass (helpers.workloads.embedding.cards.unpadded): a BERT over a batch's real
tokens alone gives the padded pass's vectors, on the torch card and through a whole run."""
import numpy as np
import pytest
import torch

from helpers.workloads.embedding import EmbeddingWorkload
from helpers.workloads.embedding.cards import unpadded
from helpers.workloads.embedding.cards.torch_card import TorchCard
from helpers.workloads.embedding.runtimes import cosines

from fake_cuda import FakeCuda


@pytest.fixture(scope="module")
def batch(st_model):
    """The sample's paragraphs, a long one cut at the model's limit, a one-word text and an
    empty one ([CLS] [SEP]), padded to the longest, as the feeder collates them."""
    from helpers.study.paths import sample_texts

    chosen = sample_texts(600)
    texts = chosen[:40:4] + sorted(chosen, key=len)[-1:] + ["a", ""]
    said = st_model.tokenizer(texts, padding=True, truncation=True,
                              max_length=st_model.max_seq_length, return_tensors="np")
    return said["input_ids"].astype(np.int64), said["attention_mask"].astype(np.int64)


def test_the_unpadded_pass_is_the_transformer_s_own_at_every_real_token(st_model, batch):
    ids, mask = batch
    assert mask.sum(axis=1).max() == st_model.max_seq_length and mask.sum(axis=1).min() == 2
    bert = st_model[0].auto_model
    with torch.inference_mode():
        padded = bert(input_ids=torch.from_numpy(ids),
                      attention_mask=torch.from_numpy(mask)).last_hidden_state
        got = unpadded.UnpaddedBert(bert, "cpu")(torch.from_numpy(ids), torch.from_numpy(mask),
                                                 mask)
    real = torch.from_numpy(mask).bool()
    assert got.shape == padded.shape
    assert (got[real] - padded[real]).abs().max() < 1e-5
    assert (got[~real] == 0).all()  # (the padding: zeros, which pooling masks out)
    one = unpadded.UnpaddedBert(bert, "cpu")(torch.from_numpy(ids[:1]),
                                             torch.from_numpy(mask[:1]), mask[:1])
    assert torch.allclose(one[0], got[0], atol=1e-5)  # (a batch of one)


def test_the_card_s_unpadded_vectors_are_its_padded_ones_and_count_the_real_tokens(st_model,
                                                                                   batch):
    ids, mask = batch
    padded = TorchCard(st_model, "cpu", normalize=True).submit(ids, mask)
    card = TorchCard(st_model, "cpu", normalize=True, unpadded=True)
    ticket = card.submit(ids, mask)
    assert card.label == "torch on cpu (unpadded)"
    assert ticket.tokens == int(mask.sum()) < ids.size and padded.tokens is None
    assert cosines(ticket.rows, padded.rows).min() > 0.9999
    np.testing.assert_allclose(ticket.rows, padded.rows, rtol=0, atol=1e-5)
    rows, tokens = card.compute(torch.from_numpy(ids), torch.from_numpy(mask))  # (the mask
    assert tokens == int(mask.sum()) and torch.allclose(rows, torch.from_numpy(ticket.rows))
    # read back from the device where the host's is not given: the GPU check's card alone)


def test_on_cuda_the_spans_go_through_one_flash_kernel(st_model, batch, monkeypatch):
    """Faked: torch's varlen_attn (CUDA only), given the packed tokens, the spans' bounds in
    int32 and the longest span, once per layer; the vectors are the per-span pass's."""
    from torch.nn.attention import varlen

    ids, mask = batch
    calls = []

    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k):
        calls.append((cu_seq_q.dtype, cu_seq_q.tolist(), max_q, max_k, query.shape))
        return unpadded.spans_attention(query, key, value,
                                        unpadded.Spans(cu_seq_q.numpy(), cu_seq_q, max_q))

    monkeypatch.setattr(varlen, "varlen_attn", varlen_attn)
    bert = st_model[0].auto_model
    with torch.inference_mode():
        flash = unpadded.UnpaddedBert(bert, "cuda:0")(torch.from_numpy(ids),
                                                      torch.from_numpy(mask), mask)
        spans = unpadded.UnpaddedBert(bert, "cpu")(torch.from_numpy(ids),
                                                   torch.from_numpy(mask), mask)
    lengths = mask.sum(axis=1)
    assert len(calls) == len(bert.encoder.layer)
    assert all(call[:4] == (torch.int32, [0, *np.cumsum(lengths).tolist()], lengths.max(),
                            lengths.max()) for call in calls)
    assert calls[0][4] == (lengths.sum(), bert.config.num_attention_heads,
                           bert.config.hidden_size // bert.config.num_attention_heads)
    assert torch.equal(flash, spans)


def test_what_the_unpadded_pass_refuses_it_says(st_model, monkeypatch):
    assert unpadded.unsupported(st_model, "cpu") is None
    card = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: card[0])
    card.append((9, 0))  # (an H200)
    assert "float16 or bfloat16, not float32" in unpadded.unsupported(st_model, "cuda:0")
    card[0] = (7, 5)  # (a T4)
    assert "compute capability 8.0 or newer (Ampere, Hopper); this one is 7.5" in \
        unpadded.unsupported(st_model, "cuda:0")
    with pytest.raises(ValueError, match="unpadded: CUDA graphs replay the padded batch's"):
        TorchCard(st_model, "cuda:0", graphs=True, unpadded=True, cuda=FakeCuda())

    class Roberta(torch.nn.Module):
        config = None

    class Transformer:
        auto_model = Roberta()

    assert unpadded.unsupported([Transformer()], "cpu") == \
        "its transformer is Roberta, not transformers' BertModel"
    bert = st_model[0].auto_model
    monkeypatch.delattr(bert.encoder.layer[0].intermediate, "intermediate_act_fn")
    monkeypatch.delattr(bert.embeddings, "token_type_embeddings")
    assert "lacks ['intermediate.intermediate_act_fn', 'embeddings.token_type_embeddings']" in \
        unpadded.unsupported(st_model, "cpu")


@pytest.mark.parametrize("options, said", [
    ({"cuda_graphs": True}, "cuda_graphs runs the padded pass"),
    ({"compile": True}, "compile runs the padded pass"),
    ({"tokenize_ahead": True}, "tokenize_ahead=True runs the model another way"),
    ({"feeder": False}, "feeder=False runs the model another way"),
    ({"runtime": "onnx"}, "runtime='onnx' runs the model another way"),
    ({"card": "h200"}, "unpadded are a real model's options"),
])
def test_unpadded_with_an_option_it_cannot_go_with_is_refused_naming_both(options, said):
    with pytest.raises(ValueError, match=said):
        EmbeddingWorkload(unpadded=True, **options)
    with pytest.raises(ValueError, match="unpadded: expected True or False"):
        EmbeddingWorkload(unpadded="yes")


@pytest.mark.slow
def test_a_run_unpadded_computes_the_real_tokens_alone_and_writes_the_padded_run_s_vectors(
        tmp_path, texts):
    from helpers.engine.pipeline import run_pipeline
    from helpers.engine.outputs.hdf5_sink import read_output

    pairs = list(enumerate(texts))
    runs = {}
    for unpadded_ in (False, True):
        output = tmp_path / f"unpadded-{unpadded_}.h5"
        stats = run_pipeline(pairs, EmbeddingWorkload(batch_size=8, unpadded=unpadded_),
                             ["cpu"], 6, output, "thread", progress=False)
        runs[unpadded_] = (stats, read_output(output))
    (padded, before), (stats, after) = runs[False], runs[True]
    assert padded.padding > 1.0 and stats.padding == 1.0
    order = np.argsort(after["ids"]), np.argsort(before["ids"])
    assert cosines(after["embeddings"][order[0]], before["embeddings"][order[1]]).min() > 0.9999
    import json

    loaded = json.loads(after["attrs"]["loaded"])["cpu"]
    assert loaded["path"] == "feeder -> torch on cpu (unpadded)"
    assert loaded["guard_min_cosine"] > 0.9999  # (guarded like any variant)
    assert after["attrs"]["unpadded"]
