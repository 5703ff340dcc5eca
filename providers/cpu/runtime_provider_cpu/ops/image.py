"""CPU kernels: ImageDecoder, through Pillow (the optional ``image`` extra).

Design notes
------------
* Pillow decodes BMP, JPEG, JPEG 2000 (when built with OpenJPEG, as its wheels are),
  TIFF, PNG, WebP and the PNM family. ``RGB``/``BGR`` convert the decoded image to 8-bit
  RGB (palette, grayscale and CMYK images are expanded, an alpha channel is dropped),
  ``Grayscale`` converts to Pillow's ``L`` (ITU-R 601-2 luma of the RGB image), giving
  ``[H, W, 3]`` / ``[H, W, 1]`` uint8 tensors. JPEG chroma upsampling is libjpeg(-turbo)'s
  default "fancy" upsampling, the method the spec names.
* A stream that cannot be decoded gives an empty ``[0, 0, C]`` tensor, as the spec says;
  so does a format outside the spec's list (GIF, ICO, ...) and an image over Pillow's
  decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``). Multi-frame files give
  their first frame.
* Without Pillow the node is declined with a reason.
"""

from __future__ import annotations

import importlib.util
import io

import numpy as np

from ..registry import kernel


def _pil():
    """Pillow's Image module, imported on first use (a session without ImageDecoder does not
    pay for it), or None where Pillow is not installed."""
    try:
        import PIL.Image
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return PIL.Image

_CHANNELS = {"RGB": 3, "BGR": 3, "Grayscale": 1}
# the spec's formats, by Pillow's names (PPM covers PBM/PGM/PPM/PNM); others decode as empty
_FORMATS = ("BMP", "JPEG", "JPEG2000", "TIFF", "PNG", "WEBP", "PPM")


def _check(node):
    if importlib.util.find_spec("PIL") is None:
        return ("ImageDecoder needs Pillow: install runtime-provider-cpu[image] "
                "(pip install pillow)")
    fmt = node.attrs.get("pixel_format")
    if fmt not in _CHANNELS:
        return f"pixel_format={fmt!r} is not one of RGB, BGR, Grayscale"
    return None


@kernel("ImageDecoder", 20, check=_check, dtypes={"uint8"})
def image_decoder(ctx, encoded, *, pixel_format):
    data = np.ascontiguousarray(encoded, dtype=np.uint8).tobytes()
    pil = _pil()  # present: the node was claimed only where Pillow is installed
    try:
        with pil.open(io.BytesIO(data), formats=_FORMATS) as img:
            img.load()
            if pixel_format == "Grayscale":
                out = np.asarray(img.convert("L"), dtype=np.uint8)[:, :, None]
            else:
                out = np.asarray(img.convert("RGB"), dtype=np.uint8)
                if pixel_format == "BGR":
                    out = out[:, :, ::-1]
    except Exception:  # noqa: BLE001 - any undecodable stream gives the empty image (spec)
        return np.zeros((0, 0, _CHANNELS[pixel_format]), dtype=np.uint8)
    return np.ascontiguousarray(out)
