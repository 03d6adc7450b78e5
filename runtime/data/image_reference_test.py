"""DecodeImage (through image_dump) against PIL's Image.open(f).convert("RGB"), on files PIL
writes: PNG (RGB, RGBA, L, LA, palette, palette with transparency), JPEG (RGB, grey, CMYK,
extraneous bytes before a marker), WebP (lossless, lossy, with alpha), GIF (palette,
interlaced, from RGB) and BMP (1, 8, 24, 32 bits). Every pixel must be equal; a truncated
JPEG and an animated WebP must be refused with a reason."""
import io
import os
import random
import subprocess
import sys

from PIL import Image


def noise(mode, w, h, seed):
    rnd = random.Random(seed)
    bands = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2, "CMYK": 4}[mode]
    data = bytes(rnd.randrange(256) if (i // bands + i) % 7 else 128
                 for i in range(w * h * bands))
    return Image.frombytes(mode, (w, h), data)


def smooth(w, h):
    im = Image.new("RGB", (w, h))
    im.putdata([(x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h)) for y in range(h)
                for x in range(w)])
    return im


def cases(work):
    out = []

    def save(name, im, fmt, **kw):
        path = os.path.join(work, name)
        im.save(path, fmt, **kw)
        out.append(path)

    save("rgb.png", noise("RGB", 23, 17, 1), "PNG")
    save("rgba.png", noise("RGBA", 19, 11, 2), "PNG")
    save("grey.png", noise("L", 13, 9, 3), "PNG")
    save("grey-alpha.png", noise("LA", 12, 7, 4), "PNG")
    save("palette.png", smooth(31, 20).quantize(colors=37), "PNG")
    p = smooth(16, 16).quantize(colors=8)
    p.info["transparency"] = 3
    save("palette-trns.png", p, "PNG", transparency=3)
    save("rgb.jpg", smooth(40, 30), "JPEG", quality=90)
    save("grey.jpg", smooth(33, 21).convert("L"), "JPEG", quality=85)
    save("cmyk.jpg", noise("CMYK", 24, 16, 5), "JPEG", quality=95)
    buf = io.BytesIO()
    smooth(32, 24).save(buf, "JPEG", quality=90)
    b = buf.getvalue()
    extra = os.path.join(work, "extraneous.jpg")  # libjpeg warns, PIL decodes
    with open(extra, "wb") as f:
        f.write(b[:-2] + b"\x00\x17\x2a" + b[-2:])
    out.append(extra)
    save("lossless.webp", noise("RGB", 21, 13, 6), "WEBP", lossless=True)
    save("lossy.webp", smooth(40, 28), "WEBP", quality=80)
    save("alpha.webp", noise("RGBA", 17, 15, 7), "WEBP", lossless=True)
    save("palette.gif", smooth(30, 20).quantize(colors=64), "GIF")
    save("interlaced.gif", smooth(48, 40).quantize(colors=100), "GIF", interlace=True)
    save("from-rgb.gif", noise("RGB", 18, 18, 8), "GIF")
    save("one-bit.bmp", noise("L", 29, 9, 9).convert("1"), "BMP")
    save("palette.bmp", smooth(27, 14).quantize(colors=200), "BMP")
    save("rgb.bmp", noise("RGB", 25, 10, 10), "BMP")
    save("rgba.bmp", noise("RGBA", 9, 6, 11), "BMP")
    return out


def dump(tool, path):
    r = subprocess.run([tool, path], capture_output=True)
    if r.returncode != 0:
        return None, r.stderr.decode().strip()
    head, _, rgb = r.stdout.partition(b"\n")
    w, h = map(int, head.split())
    return Image.frombytes("RGB", (w, h), rgb), ""


def main():
    work, tool = sys.argv[1:3]
    failures = []
    for path in cases(work):
        want = Image.open(path).convert("RGB")
        got, err = dump(tool, path)
        name = os.path.basename(path)
        if got is None:
            failures.append(f"{name}: refused: {err}")
            continue
        if got.size != want.size:
            failures.append(f"{name}: size {got.size} vs PIL {want.size}")
            continue
        diff = [abs(a - b) for a, b in zip(got.tobytes(), want.tobytes())]
        bad = sum(1 for d in diff if d)
        if bad:
            failures.append(f"{name}: {bad} of {len(diff)} bytes differ from PIL, max {max(diff)}")
        else:
            print(f"{name}: equal to PIL ({want.size[0]}x{want.size[1]}, mode {Image.open(path).mode})")
    # Refused, with a reason: a JPEG cut short (PIL: "image file is truncated"), an animation.
    with open(os.path.join(work, "rgb.jpg"), "rb") as f:
        b = f.read()
    cut = os.path.join(work, "cut.jpg")
    with open(cut, "wb") as f:
        f.write(b[: len(b) // 2])
    got, err = dump(tool, cut)
    if got is not None or "INVALID_ARGUMENT" not in err:
        failures.append(f"cut.jpg: decoded, or not refused as corrupt: {err!r}")
    frames = [smooth(10, 10), noise("RGB", 10, 10, 12)]
    anim = os.path.join(work, "anim.webp")
    frames[0].save(anim, "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    got, err = dump(tool, anim)
    if got is not None or "animated WebP" not in err:
        failures.append(f"anim.webp: not refused as animated: {err!r}")
    if failures:
        print("image reference: FAILED\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("image reference: every file equals PIL")


if __name__ == "__main__":
    main()
