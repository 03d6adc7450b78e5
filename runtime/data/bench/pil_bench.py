"""PIL reference for preprocess_bench: the same images, decoded and resized
to the same sizes (BILINEAR, PIL's antialiased triangle filter), on one
thread, bytes already in memory. Run with /usr/bin/python3 (python3-pil)."""
import io
import json
import sys
import tarfile
import time

from PIL import Image


def main(plan_path, rounds, samples):
    plan = [json.loads(l) for l in open(plan_path)]
    blobs = {}
    for shard in sorted({p["shard"] for p in plan}):
        with tarfile.open(shard) as t:
            for m in t.getmembers():
                blobs[(shard, m.name)] = t.extractfile(m).read()
    work = [(blobs[(p["shard"], p["member"])], p["sizes"]) for p in plan]
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        for data, sizes in work:
            img = Image.open(io.BytesIO(data)).convert("RGB")
            for w, h in sizes:
                img.resize((w, h), Image.BILINEAR)
        dt = time.perf_counter() - t0
        best = max(best, samples / dt)
    print("pil: %d images of %d samples, %.1f samples/s on one core" % (len(work), samples, best))
    print("PIL_SAMPLES_PER_SEC %.3f" % best)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
