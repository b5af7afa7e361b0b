//! Counters of what the proxy forwarded and injected, as JSON (status endpoint
//! and file) and as the one-line summary printed on SIGTERM.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        /// Every counter of the proxy; relaxed atomics (they are figures, not
        /// synchronisation: nothing else is read after them).
        #[derive(Default, Debug)]
        pub struct Stats {
            $(#[doc = $doc] pub $name: AtomicU64,)*
        }

        impl Stats {
            /// The counters as `(name, value)` pairs, in declaration order.
            pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }
        }
    };
}

counters! {
    connections: "Client connections accepted.",
    requests: "HTTP requests parsed from clients.",
    requests_on_reused_connections: "Requests after the first on their connection (keep-alive reuse).",
    responses: "Responses forwarded from the upstream (complete or not).",
    injected_503: "Requests answered 503 by the proxy.",
    injected_429: "Requests answered 429 by the proxy.",
    rate_limited: "Requests answered 503 SlowDown because the --rate bucket was empty.",
    resets: "Client connections reset mid-body.",
    stalls: "Responses stalled after their headers.",
    trickles: "Responses trickled.",
    upstream_connect_errors: "Upstream connections refused or failed (answered 502).",
    not_http_connections: "Connections whose bytes did not parse as HTTP/1.1 (forwarded raw from then on).",
    bytes_to_upstream: "Bytes written to the upstream.",
    bytes_to_client: "Bytes written to clients.",
}

impl Stats {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The counters as one JSON object.
    pub fn to_json(&self) -> String {
        let fields: Vec<String> = self
            .snapshot()
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        format!("{{{}}}", fields.join(","))
    }

    /// The one-line summary printed at exit.
    pub fn summary_line(&self) -> String {
        let fields: Vec<String> = self
            .snapshot()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!("faultproxy summary: {}", fields.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_summary_carry_every_counter() {
        let stats = Stats::default();
        Stats::add(&stats.injected_503, 3);
        assert!(stats.to_json().contains("\"injected_503\":3"));
        assert!(stats.to_json().starts_with("{\"connections\":0,"));
        assert!(stats.summary_line().contains(" injected_503=3 "));
    }
}
