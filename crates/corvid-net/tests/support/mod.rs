//! What the namespace tests share: a named namespace that removes itself.
#![allow(dead_code)]

#[path = "nft.rs"]
mod nft;

use corvid_net::{Netlink, Netns};
use std::process::Command;

/// A namespace `cvt<pid>-<tag>`, deleted on drop.
pub struct Named(pub String);

impl Named {
    pub fn new(tag: &str) -> Named {
        let name = format!("cvt{}-{tag}", std::process::id());
        Netns::create_named(&name).unwrap();
        Named(name)
    }

    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }

    pub fn netns(&self) -> Netns {
        Netns::open(self.path()).unwrap()
    }

    pub fn netlink(&self) -> Netlink {
        Netlink::open_in(&self.netns()).unwrap()
    }

    pub fn ip(&self, args: &str) {
        let ok = Command::new("ip")
            .args(["-n", &self.0])
            .args(args.split_whitespace())
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip -n {} {args}", self.0);
    }

    pub fn ping(&self, addr: &str) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.0, "ping", "-c1", "-W2", addr])
            .output()
            .unwrap()
            .status
            .success()
    }
}

impl Drop for Named {
    fn drop(&mut self) {
        let problem = nft::ruleset_problem(std::path::Path::new(&self.path()));
        let _ = Netns::delete_path(std::path::Path::new(&self.path()));
        if let Some(p) = problem {
            panic!("{p}");
        }
    }
}
