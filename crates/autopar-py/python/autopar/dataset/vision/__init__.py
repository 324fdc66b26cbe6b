"""MindSpore's ``dataset.vision`` operations of the ResNet tutorial, on HWC numpy images:
``Rescale``, ``Normalize``, ``HWC2CHW``, ``Resize``, ``RandomCrop``, ``RandomHorizontalFlip``.
The random ones draw from the dataset's seed, per epoch and row."""

import numpy as np

__all__ = ["Rescale", "Normalize", "HWC2CHW", "Resize", "RandomCrop", "RandomHorizontalFlip", "Inter"]


class Inter:
    NEAREST = "nearest"
    LINEAR = "linear"
    BILINEAR = "linear"


class _Random:
    _rng = None

    def _bind_rng(self, rng):
        self._rng = rng

    def _draw(self):
        if self._rng is None:
            self._rng = np.random.default_rng()
        return self._rng


class Rescale:
    def __init__(self, rescale, shift):
        self.rescale, self.shift = float(rescale), float(shift)

    def __call__(self, img):
        return (np.asarray(img, dtype=np.float32) * self.rescale + self.shift).astype(np.float32)


class Normalize:
    def __init__(self, mean, std, is_hwc=True):
        self.mean, self.std, self.hwc = np.asarray(mean, np.float32), np.asarray(std, np.float32), is_hwc

    def __call__(self, img):
        img = np.asarray(img, dtype=np.float32)
        if self.hwc:
            return (img - self.mean) / self.std
        return (img - self.mean[:, None, None]) / self.std[:, None, None]


class HWC2CHW:
    def __call__(self, img):
        img = np.asarray(img)
        return np.ascontiguousarray(img.transpose(2, 0, 1) if img.ndim == 3 else img[None])


def _size(size):
    return (size, size) if isinstance(size, int) else tuple(size)


class Resize:
    def __init__(self, size, interpolation=Inter.LINEAR):
        self.size, self.interpolation = size, interpolation

    def __call__(self, img):
        img = np.asarray(img)
        h, w = img.shape[:2]
        if isinstance(self.size, int):
            # The shorter side becomes `size`, the aspect ratio kept.
            if h <= w:
                oh, ow = self.size, int(self.size * w / h)
            else:
                oh, ow = int(self.size * h / w), self.size
        else:
            oh, ow = self.size
        if self.interpolation == Inter.NEAREST:
            ys = np.minimum((np.arange(oh) * h / oh).astype(int), h - 1)
            xs = np.minimum((np.arange(ow) * w / ow).astype(int), w - 1)
            return img[ys][:, xs]
        y0, wy = _taps(h, oh)
        x0, wx = _taps(w, ow)
        y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
        if img.dtype == np.uint8:
            # OpenCV's fixed point (MindSpore resizes with it): 11-bit weights, rounded once.
            # Each tap's weight rounded on its own from f32 (the two need not add up to 2048).
            def q(wt):
                wt = wt.astype(np.float32)
                return np.round((np.float32(1) - wt) * 2048).astype(np.int64), np.round(wt * 2048).astype(np.int64)

            (ay, by), (ax, bx) = q(wy), q(wx)
            f = img.astype(np.int64)
            shape_x = (1, -1, 1) if f.ndim == 3 else (1, -1)
            shape_y = (-1, 1, 1) if f.ndim == 3 else (-1, 1)
            ax, bx, ay, by = ax.reshape(shape_x), bx.reshape(shape_x), ay.reshape(shape_y), by.reshape(shape_y)
            rows0 = f[y0][:, x0] * ax + f[y0][:, x1] * bx
            rows1 = f[y1][:, x0] * ax + f[y1][:, x1] * bx
            # The vertical pass as OpenCV's vector code rounds it: rows shifted to 16 bits, the
            # high halves of their products with the weights, then rounded to 8 bits.
            out = ((((rows0 >> 4) * ay) >> 16) + (((rows1 >> 4) * by) >> 16) + 2) >> 2
            return np.clip(out, 0, 255).astype(np.uint8)
        f = img.astype(np.float32)
        wx_ = wx[None, :, None] if f.ndim == 3 else wx[None, :]
        wy_ = wy[:, None, None] if f.ndim == 3 else wy[:, None]
        top = f[y0][:, x0] * (1 - wx_) + f[y0][:, x1] * wx_
        bottom = f[y1][:, x0] * (1 - wx_) + f[y1][:, x1] * wx_
        out = top * (1 - wy_) + bottom * wy_
        return out.round().astype(img.dtype) if img.dtype.kind in "iu" else out.astype(img.dtype)


def _taps(size, out):
    """Each output position's first source index and the weight of the next one (pixel
    centres aligned, as OpenCV's INTER_LINEAR)."""
    src = ((np.arange(out) + 0.5) * (size / out) - 0.5).astype(np.float32).astype(np.float64)
    first = np.floor(src).astype(int)
    frac = src - first
    low = first < 0
    first[low], frac[low] = 0, 0.0
    high = first >= size - 1
    first[high], frac[high] = size - 1, 0.0
    return first, frac


class RandomCrop(_Random):
    def __init__(self, size, padding=None, pad_if_needed=False, fill_value=0, padding_mode=None):
        self.size = _size(size)
        p = padding or 0
        self.padding = (p, p, p, p) if isinstance(p, int) else (tuple(p) * 2 if len(p) == 2 else tuple(p))
        self.fill = fill_value

    def __call__(self, img):
        img = np.asarray(img)
        left, top, right, bottom = self.padding
        pads = [(top, bottom), (left, right)] + [(0, 0)] * (img.ndim - 2)
        img = np.pad(img, pads, constant_values=self.fill)
        h, w = img.shape[:2]
        ch, cw = self.size
        if ch > h or cw > w:
            raise ValueError(f"RandomCrop: the crop {self.size} is larger than the padded image {(h, w)}.")
        rng = self._draw()
        y, x = int(rng.integers(h - ch + 1)), int(rng.integers(w - cw + 1))
        return img[y : y + ch, x : x + cw]


class RandomHorizontalFlip(_Random):
    def __init__(self, prob=0.5):
        self.prob = float(prob)

    def __call__(self, img):
        img = np.asarray(img)
        return img[:, ::-1].copy() if self._draw().random() < self.prob else img
