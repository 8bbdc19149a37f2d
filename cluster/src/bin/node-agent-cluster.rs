//! `node-agent-cluster hold`: a node's holder process. It makes the node's network and mount
//! namespaces (every process of the node joins them), and on node 0 forwards the API server to
//! this host's loopback, so `kubectl` and the tests on the host reach it while no address of
//! the host's is ever given to the cluster.
//!
//! ```text
//! node-agent-cluster hold CLUSTER_DIR NODE [LISTEN=TARGET]
//! ```
//!
//! `CLUSTER_DIR` only names the process (`cargo xtask cluster down` finds holders by it).
//! `LISTEN` is bound in the host's network namespace before the new one is made; each
//! connection to it is joined to a connection made to `TARGET` from inside the node. It ends on
//! SIGTERM; the namespaces end with the last process in them.

use std::{
    io::Write as _,
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    thread,
};

fn fail(what: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "node-agent-cluster: {what}");
    std::process::exit(1)
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

fn forward(listener: TcpListener, target: SocketAddr) {
    for conn in listener.incoming() {
        let Ok(client) = conn else { continue };
        thread::spawn(move || {
            let Ok(server) = TcpStream::connect_timeout(&target, std::time::Duration::from_secs(5))
            else {
                return;
            };
            let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                return;
            };
            let up = thread::spawn(move || pipe(client, server));
            pipe(s2, c2);
            let _ = up.join();
        });
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some("hold") || !(3..=4).contains(&args.len()) {
        fail("usage: node-agent-cluster hold CLUSTER_DIR NODE [LISTEN=TARGET]");
    }
    // Bound in the host's network namespace, before leaving it.
    let forwarding = args.get(3).map(|spec| {
        let Some((listen, target)) = spec.split_once('=') else {
            fail("LISTEN=TARGET expected, e.g. 127.0.0.1:16443=10.99.0.10:6443")
        };
        let (Ok(listen), Ok(target)) = (listen.parse::<SocketAddr>(), target.parse::<SocketAddr>())
        else {
            fail("LISTEN and TARGET must be IP:PORT")
        };
        if !listen.ip().is_loopback() {
            fail("LISTEN must be a loopback address: nothing of the cluster is served beyond this host")
        }
        match TcpListener::bind(listen) {
            Ok(l) => (l, target),
            Err(e) => fail(&format!("cannot listen on {listen}: {e} (is another cluster up?)")),
        }
    });
    // SAFETY: single-threaded so far; unshare(2) and mount(2) with valid arguments.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWNS) != 0 {
            fail(&format!("unshare: {}", std::io::Error::last_os_error()));
        }
        // Nothing mounted in the node propagates to the host.
        let root = c"/";
        if libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            fail(&format!(
                "making / private: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    if let Some((listener, target)) = forwarding {
        thread::spawn(move || forward(listener, target));
    }
    println!("holding");
    loop {
        // SAFETY: pause(2); SIGTERM's default action ends the process.
        unsafe { libc::pause() };
    }
}
