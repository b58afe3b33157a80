//! What every accepted connection is set to, plain or TLS.

use std::time::Duration;

use tokio::net::TcpStream;

/// The default of `--client-timeout`: a minute, the longest an agent's stream waits for
/// a page (20 s) three times over, so a quiet but live client is never cut.
pub const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// Sets up an accepted connection: no Nagle delay (a streamed watch page is one small
/// write that must not wait for the client's delayed ACK), and a client that stops
/// answering is dropped within `timeout`. Without the last, a host that vanished without
/// closing held its watch stream, and a slot in the `watchers` gauge, until the kernel
/// gave up retransmitting (about 15 minutes), or for ever while idle.
pub(crate) fn tune(stream: &TcpStream, timeout: Duration) {
    let socket = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        // The kernel counts both in whole seconds, and refuses a zero interval.
        .with_time((timeout / 2).max(Duration::from_secs(1)))
        .with_interval((timeout / 6).max(Duration::from_secs(1)))
        .with_retries(3);
    // Each failure leaves the connection as the kernel made it, which still serves.
    let set = [
        ("TCP_NODELAY", socket.set_tcp_nodelay(true)),
        ("SO_KEEPALIVE", socket.set_tcp_keepalive(&keepalive)),
        (
            "TCP_USER_TIMEOUT",
            socket.set_tcp_user_timeout(Some(timeout)),
        ),
    ];
    for (option, result) in set {
        if let Err(e) = result {
            tracing::debug!("an accepted connection's {option}: {e}");
        }
    }
}
