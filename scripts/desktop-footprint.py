#!/usr/bin/env python3
"""Helpers for scripts/desktop-footprint.sh (standard library only).

  desktop-footprint.py sample PID          one line of JSON: the memory of PID and of every
                                           descendant (WebKit's web and network processes),
                                           from /proc/*/smaps_rollup, in kB
  desktop-footprint.py table LABEL FILE    a Markdown table of a saved sample
  desktop-footprint.py rest BEFORE AFTER   "CPU% WAKEUPS/S" of the whole tree between two saved
                                           samples: the share of a core it used, and its
                                           threads' context switches per second (each one a
                                           thread woken, or preempted)
  desktop-footprint.py total FILE          its total PSS in kB
  desktop-footprint.py close WINDOW_ID     asks an X window to close (WM_DELETE_WINDOW), as a
                                           window manager's close button does; Xvfb has no
                                           window manager, and destroying the window outright
                                           would not be the app's own close path
  desktop-footprint.py smaps PID [N]       the N biggest mappings of PID by PSS (what holds it)
  desktop-footprint.py groups PID          PID's PSS by origin: its own binary, the libraries
                                           only WebKitGTK brings in, the other libraries (GTK,
                                           GLib, the GL driver...), heap and other memory

PSS (proportional set size) counts a page shared by k processes as 1/k in each, so the sum over
the app's processes is what the app adds to the machine, shared libraries counted once.
"""

import ctypes
import json
import os
import sys
import time

FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem")


def children_map():
    kids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # comm may hold spaces and parentheses: the fields after the last ')' are fixed.
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def tree(root):
    kids = children_map()
    order, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        order.append(pid)
        todo.extend(sorted(kids.get(pid, [])))
    return order


def rollup(pid):
    values = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts and parts[0].rstrip(":") in FIELDS:
                values[parts[0].rstrip(":")] = int(parts[1])
    with open(f"/proc/{pid}/comm") as f:
        values["name"] = f.read().strip()
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime + stime (fields 14 and 15 of stat; 12 and 13 after the name), in seconds.
    values["cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    values["pid"] = pid
    values["switches"] = context_switches(pid)
    return values


def context_switches(pid):
    """Context switches so far per thread id (as strings: the sample is saved as JSON)."""
    switches = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                switches[task] = sum(
                    int(line.split(":")[1]) for line in f if "ctxt_switches:" in line
                )
        except OSError:
            pass  # the thread ended between the listing and the read
    return switches


def sample(root):
    rows = []
    for pid in tree(root):
        try:
            rows.append(rollup(pid))
        except OSError:
            pass  # exited between the listing and the read
    total = {k: sum(r.get(k, 0) for r in rows) for k in FIELDS}
    return {"processes": rows, "total": total, "at": time.monotonic()}


def rest(before_path, after_path):
    """CPU share and wake-ups per second of the app's processes between two samples (a process
    that started in between counts from its start)."""
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    seconds = after["at"] - before["at"]
    earlier = {p["pid"]: p for p in before["processes"]}
    cpu = switches = 0
    for p in after["processes"]:
        then = earlier.get(p["pid"], {"cpu_s": 0, "switches": {}})
        cpu += p["cpu_s"] - then["cpu_s"]
        # A thread that ended in between takes its switches with it; a new one counts all its own.
        for tid, count in p["switches"].items():
            switches += count - then["switches"].get(tid, 0)
    print(f"{100 * cpu / seconds:.2f} {switches / seconds:.1f}")


def mb(kb):
    return f"{kb / 1024:.1f}"


def table(label, path):
    with open(path) as f:
        data = json.load(f)
    print(f"| {label} | process | PSS MB | anon | file | RSS MB | CPU s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in data["processes"]:
        print(
            f"| | {r['name']} | {mb(r['Pss'])} | {mb(r.get('Pss_Anon', 0))} | "
            f"{mb(r.get('Pss_File', 0))} | {mb(r['Rss'])} | {r.get('cpu_s', 0):.2f} |"
        )
    t = data["total"]
    cpu = sum(r.get("cpu_s", 0) for r in data["processes"])
    print(
        f"| | **total** | **{mb(t['Pss'])}** | {mb(t['Pss_Anon'])} | {mb(t['Pss_File'])} | "
        f"{mb(t['Rss'])} | {cpu:.2f} |"
    )


def biggest_mappings(pid, n):
    maps = mapping_pss(pid)
    for name, kb in sorted(maps.items(), key=lambda kv: -kv[1])[:n]:
        print(f"{mb(kb):>8} MB  {name}")


def mapping_pss(pid):
    """PSS in kB per mapped file name ("[anon]", "[heap]", "[stack]" for the others)."""
    maps, current = {}, None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if not head:
                continue
            if "-" in head[0] and not head[0].endswith(":"):
                current = head[5] if len(head) > 5 else "[anon]"
            elif head[0] == "Pss:" and current is not None:
                maps[current] = maps.get(current, 0) + int(head[1])
    return maps


def shared_deps(library):
    """The resolved paths of the shared libraries `library` needs, itself included."""
    import subprocess

    out = subprocess.run(["ldd", library], capture_output=True, text=True).stdout
    deps = {os.path.realpath(library)}
    for line in out.splitlines():
        if "=>" in line and "/" in line.split("=>")[1]:
            deps.add(os.path.realpath(line.split("=>")[1].split()[0]))
    return deps


def groups(pid):
    libdir = "/usr/lib/x86_64-linux-gnu"
    webkit = shared_deps(f"{libdir}/libwebkit2gtk-4.1.so.0")
    # What a GTK tray app needs anyway: GTK and the tray library (dlopen'ed by the tray crate).
    gtk = shared_deps(f"{libdir}/libgtk-3.so.0")
    for tray in ("libayatana-appindicator3.so.1", "libappindicator3.so.1"):
        if os.path.exists(f"{libdir}/{tray}"):
            gtk |= shared_deps(f"{libdir}/{tray}")
    exe = os.path.realpath(f"/proc/{pid}/exe")
    totals = {}
    for name, kb in mapping_pss(pid).items():
        real = os.path.realpath(name) if name.startswith("/") else name
        if real == exe:
            group = "the app's own binary"
        elif real in webkit and real not in gtk:
            group = "libraries only WebKitGTK loads (WebKit, JSC, flite, GStreamer, ICU...)"
        elif name.startswith("/") and not name.startswith(("/memfd:", "/SYSV", "/dev/")):
            group = "other files (GTK, GLib, the GL driver, fonts...)"
        else:
            group = "heap, stacks and other anonymous memory"
        totals[group] = totals.get(group, 0) + kb
    for group, kb in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{mb(kb):>8} MB  {group}")


class XClientMessageEvent(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("serial", ctypes.c_ulong),
        ("send_event", ctypes.c_int),
        ("display", ctypes.c_void_p),
        ("window", ctypes.c_ulong),
        ("message_type", ctypes.c_ulong),
        ("format", ctypes.c_int),
        ("data", ctypes.c_long * 5),
    ]


class XEvent(ctypes.Union):
    _fields_ = [("xclient", XClientMessageEvent), ("pad", ctypes.c_long * 24)]


def close_window(window):
    x11 = ctypes.CDLL("libX11.so.6")
    x11.XOpenDisplay.restype = ctypes.c_void_p
    x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
    x11.XInternAtom.restype = ctypes.c_ulong
    x11.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    x11.XSendEvent.argtypes = [
        ctypes.c_void_p,
        ctypes.c_ulong,
        ctypes.c_int,
        ctypes.c_long,
        ctypes.POINTER(XEvent),
    ]
    x11.XFlush.argtypes = [ctypes.c_void_p]
    x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    display = x11.XOpenDisplay(None)
    if not display:
        sys.exit("close: cannot open the X display")
    event = XEvent()
    event.xclient.type = 33  # ClientMessage
    event.xclient.window = window
    event.xclient.message_type = x11.XInternAtom(display, b"WM_PROTOCOLS", 0)
    event.xclient.format = 32
    event.xclient.data[0] = x11.XInternAtom(display, b"WM_DELETE_WINDOW", 0)
    event.xclient.data[1] = 0  # CurrentTime
    x11.XSendEvent(display, window, 0, 0, ctypes.byref(event))
    x11.XFlush(display)
    x11.XCloseDisplay(display)


def main(argv):
    if len(argv) >= 3 and argv[1] == "sample":
        print(json.dumps(sample(int(argv[2]))))
    elif len(argv) == 4 and argv[1] == "table":
        table(argv[2], argv[3])
    elif len(argv) == 4 and argv[1] == "rest":
        rest(argv[2], argv[3])
    elif len(argv) == 3 and argv[1] == "total":
        with open(argv[2]) as f:
            print(json.load(f)["total"]["Pss"])
    elif len(argv) == 3 and argv[1] == "close":
        close_window(int(argv[2], 0))
    elif len(argv) == 3 and argv[1] == "groups":
        groups(int(argv[2]))
    elif len(argv) >= 3 and argv[1] == "smaps":
        biggest_mappings(int(argv[2]), int(argv[3]) if len(argv) > 3 else 12)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
