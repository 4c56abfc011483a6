//! The XDP program and its loader in a network namespace: the verifier accepts it, it attaches
//! natively on veth (generic when asked), it is detached when its owner drops it, exits on
//! SIGTERM or crashes, and a stale netlink-attached program is replaced rather than stacked.

mod lab;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use kxdp_kernel::xdp::{ModeChoice, XdpMode, XdpProgram};
use kxdp_kernel::{enter_netns, ifindex};
use lab::{ip, wait_until, xdp_on, Lab};

fn node_with_veth(lab: &mut Lab) -> String {
    let ns = lab.netns("xdp");
    lab.veth(&ns, "k0", &ns, "p0");
    ns
}

#[test]
fn xdp_loads_attaches_native_and_detaches_on_drop() {
    if !lab::available("xdp_loads_attaches_native_and_detaches_on_drop") {
        return;
    }
    let mut lab = Lab::new();
    let ns = node_with_veth(&mut lab);
    let ns2 = ns.clone();
    let (insns, mode) = Lab::in_ns(&ns, move || {
        let prog = XdpProgram::load(1).expect("load");
        prog.set_node(&["192.0.2.1".parse().unwrap()], &[30080])
            .unwrap();
        let att = prog
            .attach(ifindex("k0").unwrap(), ModeChoice::Auto)
            .expect("attach");
        assert!(!att.replaced_stale);
        assert_eq!(xdp_on(&ns2, "k0").as_deref(), Some("xdp"), "native on veth");
        let mode = att.mode;
        drop(att);
        (prog.insn_count, mode)
    });
    assert_eq!(mode, XdpMode::Native);
    assert!(insns < 200, "the program stays small: {insns} instructions");
    assert_eq!(
        xdp_on(&ns, "k0"),
        None,
        "detached when the attachment is dropped"
    );

    // Generic mode when asked.
    let ns2 = ns.clone();
    Lab::in_ns(&ns, move || {
        let prog = XdpProgram::load(1).unwrap();
        let att = prog
            .attach(ifindex("k0").unwrap(), ModeChoice::Generic)
            .unwrap();
        assert_eq!(att.mode, XdpMode::Generic);
        assert_eq!(xdp_on(&ns2, "k0").as_deref(), Some("xdpgeneric"));
    });
    assert_eq!(xdp_on(&ns, "k0"), None);
}

#[test]
fn xdp_stale_netlink_program_is_replaced_not_stacked() {
    if !lab::available("xdp_stale_netlink_program_is_replaced_not_stacked") {
        return;
    }
    let mut lab = Lab::new();
    let ns = node_with_veth(&mut lab);
    let ns2 = ns.clone();
    Lab::in_ns(&ns, move || {
        let idx = ifindex("k0").unwrap();
        // A program attached the old way outlives its loader: a stale program.
        let stale = XdpProgram::load(1).unwrap();
        stale.attach_netlink_for_test(idx, XdpMode::Native).unwrap();
        drop(stale);
        let before = ip(&ns2, "-d link show dev k0");
        assert!(before.contains("prog/xdp"), "{before}");
        let prog = XdpProgram::load(1).unwrap();
        let att = prog.attach(idx, ModeChoice::Auto).expect("replaces");
        assert!(att.replaced_stale);
        assert_eq!(att.mode, XdpMode::Native);
        let during = ip(&ns2, "-d link show dev k0");
        assert_eq!(during.matches("prog/xdp").count(), 1, "{during}");
        drop(att);
    });
    assert_eq!(xdp_on(&ns, "k0"), None, "nothing left behind");
}

/// The child half of `xdp_detached_when_owner_is_killed`: attaches, says so, then waits to be
/// killed or crashes (abort) on purpose.
#[test]
#[ignore = "helper: run by xdp_detached_when_owner_is_killed in a child process"]
fn helper_attach_and_wait() {
    let Ok(ns) = std::env::var("KXDP_LAB_CHILD_NS") else {
        return;
    };
    enter_netns(&Lab::path(&ns)).unwrap();
    let prog = XdpProgram::load(1).unwrap();
    let _att = prog
        .attach(ifindex("k0").unwrap(), ModeChoice::Auto)
        .unwrap();
    println!("ATTACHED");
    if std::env::var("KXDP_LAB_CHILD_ABORT").is_ok() {
        std::process::abort();
    }
    std::thread::sleep(Duration::from_secs(30));
}

#[test]
fn xdp_detached_when_owner_is_killed() {
    if !lab::available("xdp_detached_when_owner_is_killed") {
        return;
    }
    let mut lab = Lab::new();
    let ns = node_with_veth(&mut lab);
    for how in ["SIGTERM", "SIGKILL", "abort"] {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--ignored",
            "--exact",
            "helper_attach_and_wait",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KXDP_LAB_CHILD_NS", &ns)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        if how == "abort" {
            cmd.env("KXDP_LAB_CHILD_ABORT", "1");
        }
        let mut child = cmd.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let mut attached = false;
        while out.read_line(&mut line).unwrap_or(0) > 0 {
            if line.contains("ATTACHED") {
                attached = true;
                break;
            }
            line.clear();
        }
        assert!(attached, "{how}: child did not attach");
        if how != "abort" {
            assert!(xdp_on(&ns, "k0").is_some(), "{how}: attached while alive");
            let sig = if how == "SIGTERM" { "-TERM" } else { "-KILL" };
            lab::run("kill", &[sig, &child.id().to_string()]);
        }
        let _ = child.wait();
        assert!(
            wait_until(Duration::from_secs(5), || xdp_on(&ns, "k0").is_none()),
            "{how}: the program outlived its owner"
        );
    }
}
