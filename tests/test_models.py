"""models/: the video DiT, its rotary positions, save/load, text encoder, autoencoders, flow matching."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import conf
from models.autoencoder import DiffusersAutoencoder, IdentityAutoencoder, build_autoencoder
from models.dit.layers import RotaryEmbedding3D, apply_rotary, token_coords
from models.dit.model import FLAVORS, VideoDiT, build, flops_per_token, matmul_params
from models.flow import FlowMatching, make_scheduler, resolution_shift, shift_sigmas
from models.text_encoder import build_text_encoder

MODELS = Path(__file__).resolve().parents[1] / "models"


def _inputs(b=2, c=3, t=4, h=8, w=12, text_len=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, c, t, h, w, generator=g)
    mask = torch.ones(b, text_len, dtype=torch.bool)
    mask[-1, text_len // 2:] = False  # the last sample's caption is shorter
    return x, torch.rand(b, generator=g), torch.randn(b, text_len, 384, generator=g), mask


def _randomize_zero_init(model):
    """Give the zero-initialised layers small random weights, so that every path carries gradient."""
    g = torch.Generator().manual_seed(1)
    for p in model.parameters():
        if not p.detach().abs().any():
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


@pytest.mark.parametrize("thw", [(1, 8, 8), (4, 8, 12), (6, 16, 4), (3, 2, 2)])
@pytest.mark.parametrize("patch", [(1, 2, 2), (1, 1, 1)])
def test_output_has_the_input_shape_for_any_divisible_size(thw, patch):
    model = build("debug", patch_size=patch)
    _randomize_zero_init(model)
    x, t, y, mask = _inputs(t=thw[0], h=thw[1], w=thw[2])
    out = model(x, t, y, mask)
    assert out.shape == x.shape and torch.isfinite(out).all() and out.abs().sum() > 0


def test_sizes_that_do_not_divide_by_the_patch_are_refused():
    with pytest.raises(ValueError, match="does not divide by patch size"):
        build("debug", patch_size=(2, 2, 2))(*_inputs(t=3))


@pytest.mark.parametrize("pooled_text", [False, True])
def test_zero_init_gives_zero_output_and_every_parameter_gets_a_gradient(pooled_text):
    model = build("debug", adaln_lora_rank=8, pooled_text=pooled_text)
    x, t, y, mask = _inputs()
    assert model(x, t, y, mask).abs().max() == 0
    _randomize_zero_init(model)
    model(x, t, y, mask).square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("pooled_text", [False, True])
def test_padding_in_the_text_does_not_change_the_output(pooled_text):
    model = build("debug", pooled_text=pooled_text)
    _randomize_zero_init(model)
    x, t, y, mask = _inputs(b=1)
    mask[:] = True
    mask[0, 3:] = False
    out = model(x, t, y, mask)
    y2 = y.clone()
    y2[0, 3:] = torch.randn(2, 384)  # change only the padded tokens
    assert torch.allclose(out, model(x, t, y2, mask), atol=1e-6)
    assert not torch.allclose(out, model(x, t, y2, torch.ones_like(mask)), atol=1e-4)


def test_rope_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding3D(head_dim=48)
    grid = (4, 6, 8)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 48, generator=g), torch.randn(1, 1, 1, 48, generator=g)

    def score(a, b):
        assert all(p < n for p, n in zip(a + b, grid + grid, strict=True))
        index = torch.tensor([a[0] * 48 + a[1] * 8 + a[2], b[0] * 48 + b[1] * 8 + b[2]])
        cos, sin = rope(grid, index)
        qa = apply_rotary(q, cos[:1], sin[:1])
        kb = apply_rotary(k, cos[1:], sin[1:])
        return (qa * kb).sum().item()

    base = score((0, 1, 2), (1, 3, 3))
    for shift in [(1, 0, 0), (0, 2, 0), (0, 0, 3), (2, 1, 1)]:
        moved = score(tuple(p + s for p, s in zip((0, 1, 2), shift, strict=True)),
                      tuple(p + s for p, s in zip((1, 3, 3), shift, strict=True)))
        assert moved == pytest.approx(base, abs=1e-4)
    assert score((0, 1, 2), (1, 3, 4)) != pytest.approx(base, abs=1e-3)


def test_rope_for_a_slice_equals_the_slice_of_the_whole():
    rope = RotaryEmbedding3D(head_dim=32)
    grid = (3, 4, 5)
    cos, sin = rope(grid)
    index = torch.arange(17, 43)
    cos_s, sin_s = rope(grid, index)
    assert torch.equal(cos[17:43], cos_s) and torch.equal(sin[17:43], sin_s)
    assert token_coords(grid, torch.tensor([0, 5, 20, 59])).tolist() == [[0, 0, 0], [0, 1, 0], [1, 0, 0], [2, 3, 4]]


def test_pooled_text_reaches_every_token_without_cross_attention():
    """With pooled_text the prompt also conditions AdaLN: with every cross-attention's output zeroed,
    another prompt still gives another output; without it, the prompt is then ignored."""
    x, t, y, mask = _inputs()
    other = torch.randn_like(y)
    for pooled, depends in ((True, True), (False, False)):
        model = build("debug", pooled_text=pooled)
        _randomize_zero_init(model)
        for block in model.blocks:
            torch.nn.init.zeros_(block.cross_attn.to_out.weight)
            torch.nn.init.zeros_(block.cross_attn.to_out.bias)
        changed = not torch.allclose(model(x, t, y, mask), model(x, t, other, mask), atol=1e-6)
        assert changed == depends, pooled


def test_absolute_positions_tell_tokens_apart_where_rotary_ones_cannot():
    """Every token of a constant video has the same content. Rotary positions only weigh the values
    differently, and equal values stay equal, so every token's output is the same; with
    absolute_positions each token knows where it is."""
    x, t, y, mask = _inputs()
    x = torch.ones_like(x)
    for absolute in (False, True):
        model = build("debug", absolute_positions=absolute)
        _randomize_zero_init(model)
        out = model(x, t, y, mask)[..., ::2, ::2]  # (B, C, T, H/2, W/2): one pixel of every (1, 2, 2) token
        same = torch.allclose(out, out[..., :1, :1, :1].expand_as(out), atol=1e-6)
        assert same != absolute, absolute


def test_save_and_load_round_trip_bit_exact(tmp_path):
    model = build("debug", adaln_lora_rank=4, pooled_text=True, absolute_positions=True)
    _randomize_zero_init(model)
    model.save_pretrained(tmp_path / "dit")
    files = sorted(p.name for p in (tmp_path / "dit").iterdir())
    assert files == ["config.json", "diffusion_pytorch_model.safetensors"]
    loaded = VideoDiT.from_pretrained(tmp_path / "dit")
    for (n, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    inputs = _inputs()
    assert torch.equal(model(*inputs), loaded(*inputs))
    assert loaded.config.adaln_lora_rank == 4 and loaded.config.pooled_text and loaded.config.absolute_positions


def test_adaln_lora_cuts_modulation_parameters():
    full, lora = build("debug", hidden_size=128, num_heads=4), build("debug", hidden_size=128, num_heads=4,
                                                                       adaln_lora_rank=16)

    def mod(m):
        return sum(p.numel() for n, p in m.named_parameters() if "blocks" in n and "modulation" in n)

    assert mod(lora) < 0.2 * mod(full)


def test_models_never_import_torch_distributed():
    pattern = re.compile(r"torch\.distributed|from torch import .*distributed|import torch\.distributed")
    files = list(MODELS.rglob("*.py"))
    assert len(files) >= 5
    for path in files:
        assert not pattern.search(path.read_text()), path


def test_flavor_registry_matches_the_config_group_and_flops_formula():
    for name, flavor in FLAVORS.items():
        cfg = conf.compose("train", [f"model={name}"]).model
        assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.adaln_lora_rank) == (
            flavor.hidden_size, flavor.num_layers, flavor.num_heads, flavor.adaln_lora_rank), name
    with torch.device("meta"):
        sizes = {name: sum(p.numel() for p in build(name).parameters()) for name in FLAVORS}
    assert 100e6 < sizes["dit_130m"] < 160e6 and 0.8e9 < sizes["dit_1b"] < 1.3e9 and 6.5e9 < sizes["dit_7b"] < 8.5e9
    model = build("debug")
    d, layers = model.config.hidden_size, model.config.num_layers
    expected = 3 * (2 * matmul_params(model) + 4 * layers * d * (256 + 16))
    assert flops_per_token(model, num_tokens=256, text_len=16) == expected
    # Per-layer transformer matmuls dominate: 4D² self-attention, 4D² cross-attention, 8D² MLP.
    assert matmul_params(model) >= layers * 16 * d * d


def test_one_batch_overfits_with_the_flow_matching_loss():
    """One batch, its noise and noise levels fixed: the loss must fall towards zero."""
    torch.manual_seed(0)
    model = build("debug")
    flow = FlowMatching()
    x, _, y, mask = _inputs(b=2, t=2, h=8, w=8)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        loss = flow.loss(model, x, y, mask, generator=torch.Generator().manual_seed(123))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 1.5  # E|noise - x0|² = 2 for the zero output of the untrained model
    assert losses[-1] < 0.05 * losses[0]


def test_timestep_sampling_and_shift():
    flow = FlowMatching()
    s = flow.sample_sigmas(10_000, torch.Generator().manual_seed(0))
    assert 0 < s.min() and s.max() < 1 and abs(s.median().item() - 0.5) < 0.02
    shifted = FlowMatching(shift=3.0).sample_sigmas(10_000, torch.Generator().manual_seed(0))
    assert shifted.median() > 0.7  # more training near the noise end
    grid = torch.linspace(0, 1, 11)
    assert torch.equal(shift_sigmas(grid, 1.0), grid) and shift_sigmas(grid, 3.0)[5] == pytest.approx(0.75)
    assert resolution_shift(4096, base_tokens=1024) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="timestep_sampling"):
        FlowMatching(timestep_sampling="cosine")


@pytest.mark.parametrize("name", ["FlowMatchEulerDiscreteScheduler", "UniPCMultistepScheduler"])
def test_schedulers_recover_the_data_from_noise_with_the_true_velocity(name):
    g = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(1, 3, 2, 4, 4, generator=g), torch.randn(1, 3, 2, 4, 4, generator=g)
    scheduler = make_scheduler(name, shift=2.0)
    scheduler.set_timesteps(12)
    x = noise.clone()
    for t in scheduler.timesteps:
        x = scheduler.step(FlowMatching.target(x0, noise), t, x).prev_sample  # straight path: v is constant
    assert torch.allclose(x, x0, atol=1e-4)
    with pytest.raises(ValueError, match="scheduler"):
        make_scheduler("DDIMScheduler")


def test_minilm_text_encoder_loads_offline_and_is_frozen():
    enc = build_text_encoder(conf.compose("train").text_encoder)
    emb, mask = enc(["a red circle moves left", "a cat"])
    assert emb.shape[0] == 2 and emb.shape[2] == 384 == enc.dim and mask.dtype == torch.bool
    assert mask[0].sum() > mask[1].sum() and mask.shape == emb.shape[:2]
    assert not any(p.requires_grad for p in enc.parameters())
    again, _ = enc(["a red circle moves left", "a cat"])
    assert torch.equal(emb, again)
    other, _ = enc(["a blue square moves up", "a cat"])
    assert not torch.allclose(emb[0], other[0])


def test_a_local_t5_encoder_works_through_the_same_wrapper(tmp_path):
    from transformers import AutoTokenizer, T5Config, T5Model

    from models.text_encoder import packaged_minilm

    AutoTokenizer.from_pretrained(packaged_minilm()).save_pretrained(tmp_path / "t5")
    T5Model(T5Config(vocab_size=30522, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)).save_pretrained(
        tmp_path / "t5")
    cfg = conf.compose("train", ["text_encoder=hf_local", f"text_encoder.path={tmp_path / 't5'}"]).text_encoder
    enc = build_text_encoder(cfg)
    emb, mask = enc(["hello there", "hi"])
    assert emb.shape[-1] == 32 == enc.dim and mask.shape == emb.shape[:2]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_text_encoder(conf.compose("train", ["text_encoder=hf_local", "text_encoder.path=/nope"]).text_encoder)


def test_autoencoders_identity_and_a_tiny_diffusers_wan_vae(tmp_path):
    ident = build_autoencoder(conf.compose("train").autoencoder)
    assert isinstance(ident, IdentityAutoencoder)
    video = torch.rand(1, 3, 5, 16, 16) * 2 - 1
    assert torch.equal(ident.decode(ident.encode(video)), video)

    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[True],
                     latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.5, 2.0, 0.5, 1.0],
                     scale_factor_temporal=2, scale_factor_spatial=2).save_pretrained(tmp_path / "vae")
    cfg = conf.compose("train", ["autoencoder=diffusers", f"autoencoder.path={tmp_path / 'vae'}"]).autoencoder
    vae = build_autoencoder(cfg)
    assert isinstance(vae, DiffusersAutoencoder)
    assert (vae.latent_channels, vae.temporal_compression, vae.spatial_compression) == (4, 2, 2)
    latents = vae.encode(video)
    assert latents.shape == (1, 4, vae.latent_frames(5), 8, 8) == (1, 4, 3, 8, 8)
    assert vae.decode(latents).shape == video.shape
    with pytest.raises(ValueError, match="not a diffusers class"):
        build_autoencoder(conf.compose("train", ["autoencoder=diffusers", f"autoencoder.path={tmp_path / 'vae'}",
                                                 "autoencoder.model_class=NoSuchVAE"]).autoencoder)
