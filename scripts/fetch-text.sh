#!/usr/bin/env bash
# Fetches the evaluation text into the cache (never into the repository) and prints the paths:
#   tech.txt     technical documentation: "Debian Reference" (plain-text edition), from the
#                Debian package debian-reference-en: /usr/share/debian-reference/debian-reference.en.txt.gz
#   fiction.txt  narrative fiction: Jane Austen's six novels, from the Debian package
#                r-cran-janeaustenr (R lazy-load data, decoded here without R): Emma, Mansfield Park,
#                Northanger Abbey, Persuasion, Pride and Prejudice, Sense and Sensibility.
# Packages are downloaded with `apt-get download` (nothing is installed) and unpacked with dpkg-deb.
# Idempotent: skipped when both files exist with the recorded SHA-256.
# Cache: ${E8KV_CACHE:-$HOME/.cache/e8kv}/text/
set -euo pipefail

TECH_PKG="debian-reference-en"
TECH_VERSION="2.100"
TECH_SHA256="fc8dce7f9d076f78432b74cc91555017c855d19d5bbc5b8e7e3ad472f00ec6cf"
FICTION_PKG="r-cran-janeaustenr"
FICTION_VERSION="1.0.0-1"
FICTION_SHA256="6c20c7197d4ab5090b161993b548d31ebc975552f854edb2e86c9ffed1dd7b66"

CACHE="${E8KV_CACHE:-$HOME/.cache/e8kv}"
OUT="$CACHE/text"
TECH="$OUT/tech.txt"
FICTION="$OUT/fiction.txt"

sha() { sha256sum "$1" | cut -d' ' -f1; }
if [ -f "$TECH" ] && [ -f "$FICTION" ] && [ "$(sha "$TECH")" = "$TECH_SHA256" ] &&
   [ "$(sha "$FICTION")" = "$FICTION_SHA256" ]; then
  echo "$TECH"
  echo "$FICTION"
  exit 0
fi

for tool in apt-get dpkg-deb python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "[fetch-text] error: $tool is required (Debian)" >&2; exit 1; }
done

mkdir -p "$OUT"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
chmod 777 "$tmp"  # apt's download sandbox user must be able to write here

# The pinned version first; the distribution's current one when that is gone (hash then differs).
download() {  # package version
  (cd "$tmp" && apt-get download -q "$1=$2" >/dev/null 2>&1) && return 0
  if [ "$(id -u)" = 0 ]; then apt-get update -qq >/dev/null 2>&1 || true; fi
  (cd "$tmp" && apt-get download -q "$1=$2" >/dev/null 2>&1) && return 0
  echo "[fetch-text] warning: $1=$2 is not available; using the current version" >&2
  (cd "$tmp" && apt-get download -q "$1" >/dev/null 2>&1) ||
    { echo "[fetch-text] error: apt-get download $1 failed" >&2; exit 1; }
}
echo "[fetch-text] downloading $TECH_PKG and $FICTION_PKG (Debian)" >&2
download "$TECH_PKG" "$TECH_VERSION"
download "$FICTION_PKG" "$FICTION_VERSION"
mkdir -p "$tmp/x"
for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/x"; done

gzip -dc "$tmp/x/usr/share/debian-reference/debian-reference.en.txt.gz" > "$TECH.part"
python3 - "$tmp/x/usr/lib/R/site-library/janeaustenr/data" "$FICTION.part" <<'PY'
# Minimal reader for R's lazy-load database (Rdata.rdx index + Rdata.rdb objects): each object is
# a 4-byte big-endian length and a zlib stream holding R's XDR serialization. Only the types
# these character-vector data sets use are decoded; anything else raises an error.
import gzip, struct, sys, zlib

class RStream:
    def __init__(self, data):
        self.b, self.p, self.refs = data, 0, []

    def int(self):
        v = struct.unpack_from(">i", self.b, self.p)[0]
        self.p += 4
        return v

    def raw(self, n):
        v = self.b[self.p:self.p + n]
        if len(v) != n:
            raise ValueError("truncated R serialization")
        self.p += n
        return v

    def length(self):
        n = self.int()
        return (self.int() << 32) + self.int() if n == -1 else n

    def header(self):
        if self.raw(2) != b"X\n":
            raise ValueError("not an XDR R serialization")
        version = self.int()
        self.int(); self.int()
        if version == 3:
            self.raw(self.int())  # native encoding name

    def item(self):
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind in (241, 242, 247, 251, 252, 253, 254):  # base/empty env, namespace, missing, nil
            return None
        if kind == 255:  # reference to an earlier symbol
            index = flags >> 8
            return self.refs[(index or self.int()) - 1]
        if kind == 1:  # symbol
            name = self.item()
            self.refs.append(name)
            return name
        if kind in (2, 17):  # pairlist: (tag, value) pairs
            pairs = []
            while True:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else None
                pairs.append((tag, self.item()))
                flags = self.int()
                kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
                if kind == 254:
                    return pairs
                if kind not in (2, 17):
                    raise ValueError("unexpected R type %d in a pairlist" % kind)
        if kind == 9:  # CHARSXP; encoding flags in the levels field
            n = self.int()
            if n == -1:
                return None
            data = self.raw(n)
            return data.decode("latin-1" if (flags >> 12) & 4 else "utf-8")
        if kind in (10, 13):
            value = [self.int() for _ in range(self.length())]
        elif kind == 14:
            n = self.length()
            value = list(struct.unpack_from(">%dd" % n, self.b, self.p))
            self.p += 8 * n
        elif kind in (16, 19, 20):  # character vector, list, expression
            value = [self.item() for _ in range(self.length())]
        else:
            raise ValueError("unsupported R type %d" % kind)
        if has_attr:
            attrs = dict(self.item())
            if "names" in attrs:
                return dict(zip(attrs["names"], value))
        return value

data_dir, out_path = sys.argv[1], sys.argv[2]
index = RStream(gzip.decompress(open(data_dir + "/Rdata.rdx", "rb").read()))
index.header()
variables = index.item()["variables"]
db = open(data_dir + "/Rdata.rdb", "rb").read()
books = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility"]
texts = []
for name in books:
    offset, size = variables[name]
    blob = db[offset:offset + size]
    expected = struct.unpack(">I", blob[:4])[0]
    raw = zlib.decompress(blob[4:])
    if len(raw) != expected:
        raise ValueError("%s: decompressed %d bytes, expected %d" % (name, len(raw), expected))
    stream = RStream(raw)
    stream.header()
    lines = stream.item()
    texts.append("\n".join(line if line is not None else "" for line in lines).strip("\n") + "\n")
with open(out_path, "w", encoding="utf-8", newline="\n") as f:
    f.write("\n\n\n".join(texts))
PY

for pair in "$TECH.part:$TECH_SHA256" "$FICTION.part:$FICTION_SHA256"; do
  file="${pair%%:*}" want="${pair##*:}"
  got="$(sha "$file")"
  if [ "$got" != "$want" ]; then
    echo "[fetch-text] warning: $(basename "${file%.part}") has SHA-256 $got, the recorded one is $want" \
         "(another package version: results are not comparable with docs/engine.md)" >&2
  fi
  mv "$file" "${file%.part}"
done
echo "$TECH"
echo "$FICTION"
