"""How good a transformed image is: SSIM on luminance (Wang et al. 2004: an 11x11 gaussian
window of sigma 1.5, K1 0.01, K2 0.03, over the window positions wholly inside the image)
against a float reference downscale of the source, made with the same geometry (`fill`: scale to
cover, then the centre; `fit`: scale to fit), and the output's size in bytes. Pillow and numpy
come from bench/.venv (bench/run installs them); without them `measure` says so instead of a
figure. `python3 bench/lib/quality.py` runs the self-check.

The reference is Pillow's LANCZOS resize of each RGB channel as 32-bit float (no rounding to 8
bits, no encoder), in the source's own sRGB values, as the servers under test resize.

Where a centre crop lands when the scaled size is not whole (640x856 filled into 100x100 is
100x133.75 scaled) is a convention: imgproxy's crop sits one row from the exact centre. SSIM
takes a whole-pixel shift for a loss of structure (on bench/data's star field, 0.995 falls to
0.55), so the figure judged (`ssim`) is the best of the output shifted by up to one pixel each
way against the reference, both with their outer pixel trimmed; `ssim_exact` (no shift, whole
image) and the `shift` found are reported beside it.
"""

import io
import sys

__all__ = ["measure", "judge", "describe", "reference", "ssim", "aligned_ssim", "luma",
           "geometry", "decode"]

WIN = 11
SIGMA = 1.5
K1, K2, L = 0.01, 0.03, 255.0

# What the quality goal allows: larder's SSIM at most this far below the anchor's, at most this
# many times the anchor's bytes.
SSIM_SLACK = 0.005
BYTES_RATIO = 1.05


def _np():
    import numpy
    return numpy


def luma(rgb):
    """BT.601 luminance (what JPEG encodes as Y) of an HxWx3 array, float64, 0..255."""
    np = _np()
    rgb = np.asarray(rgb, dtype=np.float64)
    if rgb.ndim == 2:
        return rgb
    return rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114


def _gauss():
    np = _np()
    x = np.arange(WIN) - WIN // 2
    g = np.exp(-(x * x) / (2 * SIGMA * SIGMA))
    return g / g.sum()


def _filter(a, g):
    """The 'valid' separable convolution of a 2-D array with the 1-D kernel g (rows, then
    columns): one value per window position wholly inside the array."""
    n = len(g)
    rows = sum(g[i] * a[:, i:a.shape[1] - n + 1 + i] for i in range(n))
    return sum(g[i] * rows[i:rows.shape[0] - n + 1 + i, :] for i in range(n))


def ssim(a, b):
    """Mean SSIM of two equal-sized gray images (2-D arrays, 0..255), each at least 11x11."""
    np = _np()
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"sizes differ: {a.shape} against {b.shape}")
    if min(a.shape) < WIN:
        raise ValueError(f"{a.shape} is smaller than the {WIN}x{WIN} window")
    g = _gauss()
    mu_a, mu_b = _filter(a, g), _filter(b, g)
    aa = _filter(a * a, g) - mu_a * mu_a
    bb = _filter(b * b, g) - mu_b * mu_b
    ab = _filter(a * b, g) - mu_a * mu_b
    c1, c2 = (K1 * L) ** 2, (K2 * L) ** 2
    m = ((2 * mu_a * mu_b + c1) * (2 * ab + c2)) / \
        ((mu_a * mu_a + mu_b * mu_b + c1) * (aa + bb + c2))
    return float(m.mean())


def geometry(src_w, src_h, mode, w, h):
    """(crop box (x0, y0, x1, y1) in source pixels, output (width, height)) of a transform.
    mode fill: scale to cover w x h, cut the centre; fit: scale to fit inside, one side may be
    0 (proportional)."""
    if mode == "fill":
        s = max(w / src_w, h / src_h)
        cw, ch = min(w / s, src_w), min(h / s, src_h)
        x0, y0 = (src_w - cw) / 2, (src_h - ch) / 2
        return (x0, y0, x0 + cw, y0 + ch), (w, h)
    if mode == "fit":
        s = min(w / src_w if w else float("inf"), h / src_h if h else float("inf"))
        return (0, 0, src_w, src_h), (max(1, round(src_w * s)), max(1, round(src_h * s)))
    raise ValueError(f"unknown mode {mode!r}")


def reference(src_bytes, mode, w, h):
    """The float reference (HxWx3 float32) of a transform of the encoded source."""
    np = _np()
    from PIL import Image
    im = Image.open(io.BytesIO(src_bytes))
    im = im.convert("RGB")
    box, size = geometry(im.width, im.height, mode, w, h)
    chans = []
    for c in im.split():
        f = Image.fromarray(np.asarray(c, dtype=np.float32), mode="F")
        chans.append(np.asarray(f.resize(size, Image.Resampling.LANCZOS, box=box)))
    return np.stack(chans, axis=-1)


def decode(data):
    """(format name, HxWx3 uint8 array) of an encoded image."""
    np = _np()
    from PIL import Image
    im = Image.open(io.BytesIO(data))
    im.load()
    return im.format, np.asarray(im.convert("RGB"))


def measure(src_bytes, out_bytes, mode, w, h, ref=None):
    """dict(ssim, bytes, format, size) of one output against the reference, or dict(error=...)
    when it cannot be judged (Pillow or numpy missing, an undecodable output, sizes differing).
    `ref` (from `reference`) saves recomputing the reference for each system."""
    q = dict(bytes=len(out_bytes))
    try:
        ref = reference(src_bytes, mode, w, h) if ref is None else ref
        fmt, img = decode(out_bytes)
    except ImportError as e:
        return dict(q, error=f"not measured: {e.name} missing from bench/.venv")
    except Exception as e:  # noqa: BLE001 - any decoder failure is a finding, not a crash
        return dict(q, error=f"could not decode: {e}")
    q.update(format=fmt, size=f"{img.shape[1]}x{img.shape[0]}")
    if img.shape[:2] != ref.shape[:2]:
        return dict(q, error=f"output is {q['size']}, the reference "
                             f"{ref.shape[1]}x{ref.shape[0]}")
    out_y, ref_y = luma(img), luma(ref)
    q["ssim"], q["shift"] = aligned_ssim(out_y, ref_y)
    q["ssim_exact"] = round(ssim(out_y, ref_y), 4)
    return q


def aligned_ssim(out, ref, reach=1):
    """(SSIM rounded to 4 places, (dy, dx)): the best over whole-pixel shifts of `out` of up to
    `reach` each way, against `ref`, both without their outer `reach` pixels."""
    h, w = ref.shape
    inner = ref[reach:h - reach, reach:w - reach]
    scores = [(round(ssim(out[reach + dy:h - reach + dy, reach + dx:w - reach + dx], inner), 4),
               (dy, dx)) for dy in range(-reach, reach + 1) for dx in range(-reach, reach + 1)]
    # on a tie, the smallest shift
    return max(scores, key=lambda s: (s[0], -abs(s[1][0]) - abs(s[1][1])))


def describe(q):
    """'SSIM 0.9912, 3,045 bytes' (with the unshifted figure when a shift scored better)."""
    if "ssim" not in q:
        return q.get("error", "not measured")
    dy, dx = q["shift"]
    moved = f" (shifted {dy},{dx} px; unshifted {q['ssim_exact']:.4f})" if dy or dx else ""
    return f"SSIM {q['ssim']:.4f}{moved}, {q['bytes']:,} bytes"


def judge(mine, anchor, bytes_ratio=BYTES_RATIO):
    """The quality goal: (met, text). mine/anchor: `measure` results."""
    if "ssim" not in mine or "ssim" not in anchor:
        return None, "not measured: " + "; ".join(
            q["error"] for q in (mine, anchor) if "error" in q)
    floor = anchor["ssim"] - SSIM_SLACK
    cap = anchor["bytes"] * bytes_ratio
    met = mine["ssim"] >= floor and mine["bytes"] <= cap
    return met, (f"SSIM {mine['ssim']:.4f} against >= {floor:.4f}, "
                 f"{mine['bytes']:,} bytes against <= {cap:,.0f}")


def _self_check():
    np = _np()
    from PIL import Image
    rng = np.random.default_rng(1)
    # a smooth picture with edges
    y, x = np.mgrid[0:64, 0:80]
    img = 128 + 60 * np.sin(x / 5.0) * np.cos(y / 7.0) + 40 * (x > 40)
    assert abs(ssim(img, img) - 1.0) < 1e-12
    noisy = img + rng.normal(0, 8, img.shape)
    noisier = img + rng.normal(0, 20, img.shape)
    s1, s2 = ssim(img, noisy), ssim(img, noisier)
    assert 0 < s2 < s1 < 1, (s1, s2)
    assert abs(ssim(noisy, img) - s1) < 1e-12  # symmetric
    # a constant offset leaves structure and contrast: only luminance falls, a little
    assert 0.95 < ssim(img, img + 10) < 1.0
    # by hand, on one 11x11 window: flat a against flat b gives (2ab+c1)/(a2+b2+c1)
    a, b = np.full((11, 11), 100.0), np.full((11, 11), 120.0)
    c1 = (K1 * L) ** 2
    assert abs(ssim(a, b) - (2 * 100 * 120 + c1) / (100 ** 2 + 120 ** 2 + c1)) < 1e-12
    # geometry: 640x856 filled into 100x100 is the middle 640x640; 1000x872 fit 500 wide
    assert geometry(640, 856, "fill", 100, 100) == ((0.0, 108.0, 640.0, 748.0), (100, 100))
    assert geometry(1000, 872, "fit", 500, 0) == ((0, 0, 1000, 872), (500, 436))
    # the reference of a lossless source against a good 8-bit downscale: close to 1; an
    # encoder's output scores its own loss
    src = np.clip(np.stack([img, img * 0.8, 255 - img], -1), 0, 255).astype(np.uint8)
    src = np.kron(src, np.ones((4, 4, 1), dtype=np.uint8))  # 256x320
    buf = io.BytesIO()
    Image.fromarray(src).save(buf, "PNG")
    png = buf.getvalue()
    good = Image.fromarray(src).resize((80, 64), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    good.save(out, "PNG")
    q = measure(png, out.getvalue(), "fit", 80, 0)
    assert q["ssim"] > 0.99 and q["size"] == "80x64", q
    out = io.BytesIO()
    good.save(out, "JPEG", quality=20)
    q20 = measure(png, out.getvalue(), "fit", 80, 0)
    assert q20["ssim"] < q["ssim"] and q20["format"] == "JPEG", q20
    assert "error" in measure(png, out.getvalue(), "fill", 50, 50)  # wrong size is no figure
    # a crop one row off: the exact figure falls, the aligned one finds the row
    moved = np.roll(noisy, 1, axis=0)
    s, shift = aligned_ssim(moved, noisy)
    assert s == 1.0 and shift == (1, 0), (s, shift)
    assert ssim(moved, noisy) < 0.9
    assert judge(dict(ssim=0.900, bytes=1050), dict(ssim=0.905, bytes=1000))[0] is True
    assert judge(dict(ssim=0.899, bytes=1000), dict(ssim=0.905, bytes=1000))[0] is False
    assert judge(dict(ssim=0.950, bytes=1051), dict(ssim=0.905, bytes=1000))[0] is False
    try:
        import skimage.metrics  # optional: agree with scikit-image's gaussian SSIM
        ref = skimage.metrics.structural_similarity(img, noisy, gaussian_weights=True, sigma=1.5,
                                                    use_sample_covariance=False, data_range=255)
        assert abs(ref - s1) < 1e-3, (ref, s1)
    except ImportError:
        pass


if __name__ == "__main__":
    _self_check()
    print("bench quality: self-check passed", file=sys.stderr)
