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
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.ns])
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
