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
        ys = np.clip((np.arange(oh) + 0.5) * h / oh - 0.5, 0, h - 1)
        xs = np.clip((np.arange(ow) + 0.5) * w / ow - 0.5, 0, w - 1)
        y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
        y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
        wy, wx = (ys - y0)[:, None], (xs - x0)[None, :]
        f = img.astype(np.float32)
        if f.ndim == 3:
            wy, wx = wy[..., None], wx[..., None]
        top = f[y0][:, x0] * (1 - wx) + f[y0][:, x1] * wx
        bottom = f[y1][:, x0] * (1 - wx) + f[y1][:, x1] * wx
        out = top * (1 - wy) + bottom * wy
        return out.round().astype(img.dtype) if img.dtype.kind in "iu" else out.astype(img.dtype)


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
