//! Another machine for tests that cross one: a network namespace joined to this one by a veth
//! pair, each side with its own address on a /30. Needs root and iproute2; `create` says why
//! it cannot when it cannot, and the caller skips.
#![allow(dead_code)]

use std::process::{Command, Stdio};

/// A namespace with a veth link to this one; removed on drop.
pub struct FarSide {
    ns: String,
    host_if: String,
    /// This side's address on the link.
    pub host_ip: String,
    /// The namespace's address on the link.
    pub far_ip: String,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `inner` run inside the namespace `ns`, with its arguments and environment.
fn exec_in(ns: &str, inner: &Command) -> Command {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", ns])
        .arg(inner.get_program())
        .args(inner.get_args())
        .stdin(Stdio::null());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    command
}

impl FarSide {
    /// The namespace and its link, or why they cannot be made here. `label` and `subnet` keep
    /// the names and the /30 (in `10.SUBNET.0.0/16`) of each test binary its own.
    pub fn create(label: &str, subnet: u8) -> Result<FarSide, String> {
        // Names and a /30 of our own, distinct between concurrent runs.
        let n = (std::process::id() % 200) + 20;
        let ns = format!("mr-{label}-{n}");
        let tag = &label[..label.len().min(4)];
        let (host_if, far_if) = (format!("mr{tag}{n}h"), format!("mr{tag}{n}w"));
        let (host_ip, far_ip) = (format!("10.{subnet}.{n}.1"), format!("10.{subnet}.{n}.2"));
        ip(&["link", "del", &host_if]);
        ip(&["netns", "del", &ns]);
        if !ip(&["netns", "add", &ns]) {
            return Err("cannot create a network namespace (needs root and iproute2)".into());
        }
        let side = FarSide {
            ns: ns.clone(),
            host_if: host_if.clone(),
            host_ip: host_ip.clone(),
            far_ip: far_ip.clone(),
        };
        let steps: [&[&str]; 7] = [
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", &far_if,
            ],
            &["link", "set", &far_if, "netns", &ns],
            &["addr", "add", &format!("{host_ip}/30"), "dev", &host_if],
            &["link", "set", &host_if, "up"],
            &[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{far_ip}/30"),
                "dev",
                &far_if,
            ],
            &["-n", &ns, "link", "set", &far_if, "up"],
            &["-n", &ns, "link", "set", "lo", "up"],
        ];
        for step in steps {
            if !ip(step) {
                return Err(format!("`ip {}` failed", step.join(" ")));
            }
        }
        Ok(side)
    }

    /// `command` run inside the namespace, with its arguments and environment.
    pub fn command(&self, inner: &Command) -> Command {
        exec_in(&self.ns, inner)
    }

    pub fn cut(&self) {
        assert!(ip(&["link", "set", &self.host_if, "down"]), "cut the link");
    }

    pub fn heal(&self) {
        assert!(ip(&["link", "set", &self.host_if, "up"]), "heal the link");
    }
}

impl Drop for FarSide {
    fn drop(&mut self) {
        ip(&["link", "del", &self.host_if]);
        ip(&["netns", "del", &self.ns]);
    }
}

/// Two namespaces joined to each other by a veth pair (not to this one): two machines on a LAN
/// of their own, so nothing they send (mDNS announcements and queries included) reaches this
/// machine's networks. Addresses on a /24, so one side can move to another address on the
/// same LAN, as a home router's new lease does.
pub struct LanPair {
    /// The first machine's namespace.
    pub a: String,
    /// The second machine's namespace.
    pub b: String,
    a_if: String,
    /// The first machine's address now.
    pub a_ip: String,
    /// The second machine's address.
    pub b_ip: String,
    subnet: String,
}

impl LanPair {
    /// The two namespaces and their link, or why they cannot be made here.
    pub fn create(label: &str, subnet: u8) -> Result<LanPair, String> {
        let n = (std::process::id() % 200) + 20;
        let (a, b) = (format!("mr-{label}a-{n}"), format!("mr-{label}b-{n}"));
        let tag = &label[..label.len().min(4)];
        let (a_if, b_if) = (format!("mr{tag}{n}a"), format!("mr{tag}{n}b"));
        let subnet = format!("10.{subnet}.{n}");
        for ns in [&a, &b] {
            ip(&["netns", "del", ns]);
            if !ip(&["netns", "add", ns]) {
                return Err("cannot create a network namespace (needs root and iproute2)".into());
            }
        }
        let pair = LanPair {
            a: a.clone(),
            b: b.clone(),
            a_if: a_if.clone(),
            a_ip: format!("{subnet}.1"),
            b_ip: format!("{subnet}.2"),
            subnet,
        };
        let (a_cidr, b_cidr) = (format!("{}/24", pair.a_ip), format!("{}/24", pair.b_ip));
        let steps: [&[&str]; 7] = [
            &[
                "-n", &a, "link", "add", &a_if, "type", "veth", "peer", "name", &b_if, "netns", &b,
            ],
            &["-n", &a, "addr", "add", &a_cidr, "dev", &a_if],
            &["-n", &b, "addr", "add", &b_cidr, "dev", &b_if],
            &["-n", &a, "link", "set", &a_if, "up"],
            &["-n", &b, "link", "set", &b_if, "up"],
            &["-n", &a, "link", "set", "lo", "up"],
            &["-n", &b, "link", "set", "lo", "up"],
        ];
        for step in steps {
            if !ip(step) {
                return Err(format!("`ip {}` failed", step.join(" ")));
            }
        }
        Ok(pair)
    }

    /// `inner` run inside namespace `ns`, with its arguments and environment.
    pub fn command(&self, ns: &str, inner: &Command) -> Command {
        exec_in(ns, inner)
    }

    /// The first machine gets a new address (`.HOST` on the same /24), its old one gone.
    pub fn move_a(&mut self, host: u8) {
        let new_ip = format!("{}.{host}", self.subnet);
        assert!(
            ip(&["-n", &self.a, "addr", "flush", "dev", &self.a_if]),
            "flush the old address"
        );
        assert!(
            ip(&[
                "-n",
                &self.a,
                "addr",
                "add",
                &format!("{new_ip}/24"),
                "dev",
                &self.a_if
            ]),
            "add the new address"
        );
        self.a_ip = new_ip;
    }
}

impl Drop for LanPair {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and so the pair.
        ip(&["netns", "del", &self.a]);
        ip(&["netns", "del", &self.b]);
    }
}
