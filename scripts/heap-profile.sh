#!/usr/bin/env bash
# Heap profile of the proxy (or the worker) during one benchmark scenario (default: idle10k),
# with heaptrack.
#
#   scripts/heap-profile.sh [scenario] [proxy|worker]
#
# Builds `modelrelay` with the system allocator (heaptrack hooks malloc; jemalloc's own calls
# would be invisible) and line tables (`--profile profiling`), runs the benchmark with the proxy
# (or the worker) under heaptrack and the other plain, then prints the allocation sizes that add up to the most
# bytes and the allocation sites holding the most at the peak. Full reports are left in
# target/heap-profile/. The bench's RSS figures in such a run are the wrapper's: ignore them.
set -euo pipefail

scenario="${1:-idle10k}"
role="${2:-proxy}"
case "$role" in
proxy) command=serve ;;
worker) command=worker ;;
*) echo "profile the proxy or the worker, not $role" >&2; exit 1 ;;
esac
cd "$(dirname "$0")/.."
if ! command -v heaptrack >/dev/null; then
    echo "heaptrack is not installed; on Debian/Ubuntu: apt-get install heaptrack" >&2
    exit 1
fi

echo "==> building modelrelay (profiling profile, system allocator)"
cargo build --profile profiling -p relay-core --bin modelrelay --features system-allocator
binary="$PWD/target/profiling/modelrelay"
out="$PWD/target/heap-profile"
mkdir -p "$out"
rm -f "$out/$role".*

# The bench starts the proxy as `<binary> serve ...` and the worker as `<binary> worker ...`,
# and stops them with SIGTERM. heaptrack's launcher does not pass that signal on, so the wrapper
# forwards it to the profiled process and waits for heaptrack to finish its file.
wrapper="$out/modelrelay-under-heaptrack"
cat >"$wrapper" <<EOF
#!/usr/bin/env bash
if [ "\$1" != $command ]; then exec "$binary" "\$@"; fi
heaptrack -o "$out/$role" "$binary" "\$@" &
launcher=\$!
trap 'pkill -TERM -f "^$binary $command"' TERM INT
wait \$launcher || wait \$launcher
EOF
chmod +x "$wrapper"

echo "==> running the $scenario benchmark with the $role under heaptrack"
RELAY_BENCH_BINARY="$wrapper" cargo bench -p relay-core --bench relay -- "$scenario"
# heaptrack may still be writing after the bench has moved on.
for _ in $(seq 60); do
    pgrep -f "heaptrack_interpret" >/dev/null || break
    sleep 1
done
data=$(ls "$out/$role".* | head -1)

heaptrack_print -f "$data" -p 1 -a 0 -T 0 -l 0 -m 0 -n 15 -H "$out/sizes.txt" >"$out/peaks.txt"
echo
echo "==> allocation sizes by total bytes allocated over the run (size: count)"
sort -k1,1n "$out/sizes.txt" | awk '{ print $1 * $2, $1, $2 }' | sort -k1,1nr | head -12 |
    awk '{ printf "  %8d B x %8d = %7.1f MB\n", $2, $3, $1 / 1048576 }'
echo
echo "==> biggest holders at the peak: bytes, then where (two library frames, the first of ours)"
echo "    (full backtraces: $out/peaks.txt)"
awk '
/peak memory consumed/ { print "  " $0; shown = 0; ours = 0; next }
/^ +at / && $0 !~ /\/(bytes-[0-9.]+|alloc)\// {
    line = $0
    sub(/^ +at .*registry\/src\/[^\/]+\//, "", line)
    sub(/^ +at .*relay-core\//, "relay-core/", line)
    if (line ~ /^relay-core\// && !ours) { print "      " line; ours = 1 }
    else if (line ~ /^[a-z_-]+-[0-9][^\/]*\// && shown < 2) { print "      " line; shown++ }
}' "$out/peaks.txt" | head -60
