"""Text from any checkpoint the kit reads (a teacher, a student of any placement, an export), greedy or with
temperature and top-k, with a KV cache that reuses each layer's placement (model.PLACEMENTS), so a new placement
samples without changes here. The prompt is encoded as a document is (<|endoftext|> first); generation stops at
the next <|endoftext|> or after max_new_tokens.

    python repro.py sample runs/toy/s42/post-grow/phase-2 --prompt "The state of the Union" --max-new-tokens 40
"""

from pathlib import Path

import torch
import torch.nn.functional as F

import model
from experiments import presets
from model import apply_rope, rope_cos_sin
from plumbing import corpora, errors
from tools import checkpoints

DEFAULT_NEW_TOKENS = 64  # without --max-new-tokens (fewer where the trained context ends first: smoke's is 32)


class CachedLayer:
    """A DecoderLayer whose attention appends this step's keys and values to its cache and attends over all."""

    def __init__(self, layer: model.DecoderLayer, cache: dict):
        self.layer, self.cache = layer, cache

    def __getattr__(self, name):  # the layer's norms, MLP and residual scale, whatever its placement has
        return getattr(self.layer, name)

    def self_attn(self, x, cos, sin):
        attn = self.layer.self_attn
        B, T, _ = x.shape
        q, k, v = attn.project(x)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        first = "k" not in self.cache
        if not first:
            k, v = torch.cat([self.cache["k"], k], dim=2), torch.cat([self.cache["v"], v], dim=2)
        self.cache["k"], self.cache["v"] = k, v
        # The prompt attends causally; a later token is the newest position and sees every cached one.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=first, enable_gqa=attn.n_kv != attn.n_heads)
        return attn.o_proj(y.transpose(1, 2).reshape(B, T, attn.n_heads * attn.head_dim))


@torch.no_grad()
def next_logits(net, input_ids: torch.Tensor, caches: list[dict], position: int) -> torch.Tensor:
    """Logits of the last position after feeding input_ids (B, T) at positions position..position+T-1."""
    student = isinstance(net, model.Student)
    entry, final = (net.entry_module(), net.final_module(net.blocks)) if student else (None, net.norm)
    h = net.embed_tokens(input_ids)
    cos, sin = rope_cos_sin(net.config, position + input_ids.shape[1], input_ids.device)
    cos, sin = cos[position:], sin[position:]
    if entry is not None:
        h = entry(h)
    for i, (layer, cache) in enumerate(zip(net.layers, caches)):
        if student and i % net.layers_per_block == 0:
            h = net.enter_block(i // net.layers_per_block, h, None)
        h = layer.placement.layer_forward(CachedLayer(layer, cache), h, cos, sin)
    if final is not None:
        h = final(h)
    return h[:, -1] @ net.head_weight.T


@torch.no_grad()
def generate(net, prompt_ids: list[int], max_new_tokens: int, eos_id: int, temperature: float = 0.0,
             top_k: int = 0, seed: int = 0, on_token=None) -> list[int]:
    """New token ids after prompt_ids (eos included if reached). temperature 0: greedy (the lowest id on a tie);
    else softmax(logits / temperature) over the top_k most likely tokens (0: all), drawn with `seed`."""
    if isinstance(net, model.Student) and net.boundary == "mirror-fwd":
        raise errors.CheckpointError("a mirror-fwd student's forward needs its reference run's boundary profile; "
                                     "it cannot be sampled on its own")
    device = net.embed_tokens.weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    caches = [{} for _ in net.layers]
    ids, out, position = torch.tensor([prompt_ids], device=device), [], 0
    for _ in range(max_new_tokens):
        logits = next_logits(net, ids, caches, position).float()[0]
        position += ids.shape[1]
        if temperature <= 0:
            token = int(torch.argmax(logits))
        else:
            # The top_k most likely tokens, lowest id first among equals (top_k 1 is greedy), then the softmax in fp64,
            # where any finite temperature stays finite (in fp32 one above 3.4e38 is inf).
            scaled = logits.double() / temperature
            if top_k:
                kept = torch.sort(logits, descending=True, stable=True).indices[:top_k]
                scaled = torch.full_like(scaled, float("-inf")).index_copy(0, kept, scaled[kept])
            token = int(torch.multinomial(torch.softmax(scaled, -1), 1, generator=generator))
        out.append(token)
        if on_token:
            on_token(out)
        if token == eos_id:
            break
        ids = torch.tensor([[token]], device=device)
    return out


def continue_prompt(checkpoint: Path, prompt: str, max_new_tokens: int | None, temperature: float, top_k: int,
                    seed: int, runs_dir: Path, echo):
    """`repro.py sample`: the prompt, then its continuation token by token through echo(text, nl=...) (a character
    split across tokens waits for the rest), within the checkpoint's trained context."""
    checkpoint = checkpoints.checkpoint_in(checkpoint, said := [])
    config = checkpoints.checkpoint_config(checkpoint)
    enc = corpora.vocabulary(presets.PRESETS[checkpoints.scale_of(config, runs_dir, checkpoint)].data)
    prompt_ids = [enc.eot] + enc.encode(prompt)
    context, where = checkpoints.trained_context(checkpoint, config)
    room = context - len(prompt_ids)  # past the positions the model was trained on its text is noise
    trained = f"the {context:,} positions {checkpoint} was trained on ({where})"
    if room < 1:
        raise errors.OptionError("--prompt", f"{len(prompt_ids):,} tokens (<|endoftext|> first) fill {trained}; shorten it")
    max_new_tokens = min(DEFAULT_NEW_TOKENS, room) if max_new_tokens is None else max_new_tokens
    if max_new_tokens > room:
        raise errors.OptionError("--max-new-tokens", f"{max_new_tokens:,}: with the prompt's {len(prompt_ids):,} token(s) "
                                 f"that passes {trained}; ask for at most {room:,}")
    if top_k > config["vocab_size"]:
        raise errors.OptionError("--top-k", f"{top_k:,}: above {checkpoint}'s vocabulary of {config['vocab_size']:,} "
                                 "tokens; 0 means every token")
    net = checkpoints.load_checkpoint(checkpoint, config)
    checkpoints.say(said)
    shown = [""]

    def stream(tokens, last=False):
        text = enc.decode([t for t in tokens if t != enc.eot])
        if last or not text.endswith("\ufffd"):
            echo(text[len(shown[0]):], nl=last)
            shown[0] = text
    echo(prompt, nl=False)
    try:
        new = generate(net, prompt_ids, max_new_tokens, enc.eot, temperature, top_k, seed, on_token=stream)
    except KeyboardInterrupt:
        echo()  # the text so far ends its line; the one error line follows on its own
        raise
    stream(new, last=True)
