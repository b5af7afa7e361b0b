//! The metrics endpoint's connections, counted by peer address: one peer
//! holds at most [`MAX_CONNECTIONS_PER_PEER`], and a newer connection of a
//! peer at its share takes the place of the peer's oldest one still waiting
//! for its request head, so idle connections never shut out a scrape, of
//! another address or of their own (issue 36).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The most connections open at once from one peer address: a scraper
/// opens one per scrape.
pub const MAX_CONNECTIONS_PER_PEER: usize = 32;

/// A connection still waiting for its request head, which a newer one of
/// its peer may close to take its place.
struct Waiting {
    id: u64,
    evicted: Arc<Evicted>,
}

/// Set, and notified, when a newer connection of the peer took this one's
/// place (it was uncounted then).
#[derive(Default)]
struct Evicted {
    done: std::sync::atomic::AtomicBool,
    notify: Notify,
}

/// The connections open from one peer address, those still waiting for
/// their request head oldest first.
#[derive(Default)]
pub(crate) struct Peer {
    open: usize,
    waiting: std::collections::VecDeque<Waiting>,
}

pub(crate) type Peers = Arc<Mutex<HashMap<IpAddr, Peer>>>;

fn lock(peers: &Peers) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Peer>> {
    peers.lock().unwrap_or_else(|p| p.into_inner())
}

/// One open connection of a peer, counted until it is dropped.
pub(crate) struct PeerPlace {
    peers: Peers,
    ip: IpAddr,
    id: u64,
    evicted: Arc<Evicted>,
}

impl PeerPlace {
    /// Counts a connection of `ip`. A peer holds at most
    /// [`MAX_CONNECTIONS_PER_PEER`]: at that count, its oldest connection
    /// still waiting for a request head is told to close (an idle client
    /// never shuts out a new one of the same address); None when every one
    /// of them is past its head (being answered).
    pub(crate) fn take(peers: &Peers, ip: IpAddr, id: u64) -> Option<PeerPlace> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut all = lock(peers);
        let peer = all.entry(ip).or_default();
        if peer.open >= MAX_CONNECTIONS_PER_PEER {
            let oldest = peer.waiting.pop_front()?;
            // Under the lock: its drop sees it was uncounted here.
            oldest.evicted.done.store(true, Relaxed);
            oldest.evicted.notify.notify_one();
            peer.open -= 1;
        }
        peer.open += 1;
        let evicted = Arc::new(Evicted::default());
        peer.waiting.push_back(Waiting {
            id,
            evicted: evicted.clone(),
        });
        Some(PeerPlace {
            peers: peers.clone(),
            ip,
            id,
            evicted,
        })
    }

    /// Its request head came: no newer connection may close it now.
    pub(crate) fn answering(&self) {
        if let Some(peer) = lock(&self.peers).get_mut(&self.ip) {
            peer.waiting.retain(|w| w.id != self.id);
        }
    }

    /// Waits until a newer connection of the peer takes this one's place.
    pub(crate) async fn evicted(&self) {
        self.evicted.notify.notified().await;
    }
}

impl Drop for PeerPlace {
    fn drop(&mut self) {
        let mut all = lock(&self.peers);
        let Some(peer) = all.get_mut(&self.ip) else {
            return;
        };
        peer.waiting.retain(|w| w.id != self.id);
        if !self.evicted.done.load(std::sync::atomic::Ordering::Relaxed) {
            peer.open = peer.open.saturating_sub(1);
        }
        if peer.open == 0 && peer.waiting.is_empty() {
            all.remove(&self.ip);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::{Duration, Instant};

    use crate::metrics::http::{MetricsServer, MAX_CONNECTIONS};

    fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(request);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// A connection to `dst` from the source address `src` (the whole of
    /// 127/8 is this machine: another peer address on one host).
    fn connect_from(src: [u8; 4], dst: SocketAddr) -> TcpStream {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let stream = rt
            .block_on(async {
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.bind(SocketAddr::from((src, 0)))?;
                socket.connect(dst).await
            })
            .unwrap();
        let stream = stream.into_std().unwrap();
        stream.set_nonblocking(false).unwrap();
        stream
    }

    fn timed_scrape(s: TcpStream) -> (String, Duration) {
        let started = Instant::now();
        let mut s = s;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        (
            String::from_utf8_lossy(&out).into_owned(),
            started.elapsed(),
        )
    }

    #[test]
    fn one_peers_idle_connections_do_not_slow_another_peers_scrape() {
        let server = MetricsServer::start("127.0.0.1:0", "t").unwrap();
        let addr = server.local_addr();
        let idle: Vec<TcpStream> = (0..700)
            .filter_map(|_| TcpStream::connect(addr).ok())
            .collect();
        assert!(idle.len() >= MAX_CONNECTIONS, "{} connected", idle.len());
        for _ in 0..3 {
            let started = Instant::now();
            let (ok, _) = timed_scrape(connect_from([127, 0, 0, 2], addr));
            let took = started.elapsed();
            assert!(ok.starts_with("HTTP/1.1 200 "), "{ok}");
            assert!(
                took < Duration::from_millis(500),
                "the scrape took {took:?}"
            );
        }
        drop(idle);
    }

    #[test]
    fn a_scrape_is_answered_at_once_beside_its_own_peers_idle_connections() {
        let server = MetricsServer::start("127.0.0.1:0", "t").unwrap();
        let addr = server.local_addr();
        let idle: Vec<TcpStream> = (0..700)
            .filter_map(|_| TcpStream::connect(addr).ok())
            .collect();
        // Taken in (the places of the oldest idle ones), answered at once.
        for _ in 0..3 {
            let started = Instant::now();
            let ok = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
            let took = started.elapsed();
            assert!(ok.starts_with("HTTP/1.1 200 "), "{ok}");
            assert!(
                took < Duration::from_millis(500),
                "the scrape took {took:?}"
            );
        }
        drop(idle);
    }
}
