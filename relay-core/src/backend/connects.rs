//! A bound on the TCP connects an HTTP client has in flight, so a burst of requests does not
//! become a burst of connects.
//!
//! When thousands of requests arrive at once and the pool has no idle connection for them, an
//! unbounded client opens a connection per request at the same instant. The backend's listen
//! queue (128 for llama-server, whose HTTP library listens with 128, and for tokio servers)
//! overflows, the kernel drops the SYNs it has no room for, and each of those connects waits
//! for the SYN to be sent again — after one second the first time. Bounded, the connects go
//! out a few dozen at a time; each completes in well under a millisecond on a local network,
//! and a request waiting for a permit also takes any pooled connection that comes free first
//! (hyper's pool races the checkout against the connect), so nothing waits longer than the
//! connects ahead of it.
//!
//! What it does not bound: a connect ends with the handshake, but the backend's queue also
//! holds connections that are established and not yet accepted. A backend whose accept loop
//! falls behind (a busy process) can still overflow it; bounding that too would mean holding
//! the permit until the backend's first byte on the new connection, which reqwest's connector
//! layer cannot see (BENCHMARKS.md, burst).
//!
//! The bound is a [`tower_layer::Layer`] on the client's connector (`connector_layer`), so it
//! counts connects only: requests on pooled connections never wait for it. A request dropped
//! while waiting gives up its place; a connect that finishes releases its permit whether it
//! succeeded or not.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::Semaphore;
use tower_service::Service;

/// Limits the connects of the connector it wraps to `permits` at a time.
#[derive(Debug, Clone)]
pub struct ConnectLimit {
    permits: Arc<Semaphore>,
}

impl ConnectLimit {
    /// At most `in_flight` connects at a time (at least one).
    pub fn new(in_flight: usize) -> Self {
        ConnectLimit {
            permits: Arc::new(Semaphore::new(in_flight.max(1))),
        }
    }

    /// Connects that could start now (for tests and diagnostics).
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }
}

impl<S> tower_layer::Layer<S> for ConnectLimit {
    type Service = Limited<S>;

    fn layer(&self, inner: S) -> Limited<S> {
        Limited {
            inner,
            permits: self.permits.clone(),
        }
    }
}

/// A connector whose connects wait for a permit of their [`ConnectLimit`].
#[derive(Debug, Clone)]
pub struct Limited<S> {
    inner: S,
    permits: Arc<Semaphore>,
}

impl<S, R> Service<R> for Limited<S>
where
    S: Service<R> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: From<&'static str>,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    /// Always ready: the wait for a permit happens in the call, where dropping the request
    /// cancels it (a permit taken here could be held by a caller that never calls).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        let permits = self.permits.clone();
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let _permit = permits
                .acquire_owned()
                .await
                .map_err(|_| S::Error::from("the connect limiter was closed"))?;
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            inner.call(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use axum::routing::get;
    use axum::serve::ListenerExt;
    use tokio::sync::watch;

    use super::*;

    /// A connector layer that counts the connects running through it at once, each held for a
    /// few milliseconds so that unbounded ones would overlap.
    #[derive(Clone, Default)]
    struct CountConnects {
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
    }

    impl<S> tower_layer::Layer<S> for CountConnects {
        type Service = Counted<S>;
        fn layer(&self, inner: S) -> Counted<S> {
            Counted {
                inner,
                counts: self.clone(),
            }
        }
    }

    #[derive(Clone)]
    struct Counted<S> {
        inner: S,
        counts: CountConnects,
    }

    impl<S, R> Service<R> for Counted<S>
    where
        S: Service<R> + Clone + Send + 'static,
        S::Future: Send,
        R: Send + 'static,
    {
        type Response = S::Response;
        type Error = S::Error;
        type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, request: R) -> Self::Future {
            let counts = self.counts.clone();
            let connect = self.inner.call(request);
            Box::pin(async move {
                let now = counts.now.fetch_add(1, Ordering::SeqCst) + 1;
                counts.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                let connected = connect.await;
                counts.now.fetch_sub(1, Ordering::SeqCst);
                connected
            })
        }
    }

    /// A backend on 127.0.0.1:0 that counts the connections it accepted; `/hold` answers only
    /// once `released` turns true, so every request in flight holds a connection of its own. (A
    /// `watch`, not a `Notify`: a connection is counted when it is accepted, before its handler
    /// runs, and a `Notify` would miss handlers that start waiting after the release.)
    async fn backend(released: watch::Receiver<bool>) -> (String, Arc<AtomicUsize>) {
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let listener = listener.tap_io(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let app = axum::Router::new()
            .route("/quick", get(|| async { "ok" }))
            .route(
                "/hold",
                get(move || {
                    let mut released = released.clone();
                    async move {
                        let _ = released.wait_for(|released| *released).await;
                        "released"
                    }
                }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, accepted)
    }

    fn client(limit: &ConnectLimit, counts: &CountConnects) -> reqwest::Client {
        reqwest::Client::builder()
            .no_proxy()
            .connector_layer(counts.clone())
            .connector_layer(limit.clone())
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn a_burst_of_requests_opens_its_connections_at_most_the_bound_at_a_time() {
        let (release, released) = watch::channel(false);
        let (url, accepted) = backend(released).await;
        let (limit, counts) = (ConnectLimit::new(8), CountConnects::default());
        let client = client(&limit, &counts);
        let requests: Vec<_> = (0..200)
            .map(|_| tokio::spawn(client.get(format!("{url}/hold")).send()))
            .collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while accepted.load(Ordering::SeqCst) < 200 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "connections stalled"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        release.send_replace(true);
        for request in requests {
            let response = request.await.unwrap().unwrap();
            assert_eq!(response.text().await.unwrap(), "released");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 200, "one connection each");
        let most = counts.most.load(Ordering::SeqCst);
        assert!((2..=8).contains(&most), "{most} connects at once");
        assert_eq!(limit.available(), 8);
    }

    #[tokio::test]
    async fn sequential_requests_reuse_one_connection() {
        let (url, accepted) = backend(watch::channel(false).1).await;
        let client = client(&ConnectLimit::new(8), &CountConnects::default());
        for _ in 0..20 {
            let response = client.get(format!("{url}/quick")).send().await.unwrap();
            assert_eq!(response.text().await.unwrap(), "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn requests_cancelled_while_waiting_to_connect_give_their_places_back() {
        let (release, released) = watch::channel(false);
        let (url, accepted) = backend(released).await;
        let (limit, counts) = (ConnectLimit::new(2), CountConnects::default());
        let client = client(&limit, &counts);
        // Many more requests than permits, all cancelled while most wait for a permit.
        let waiting: Vec<_> = (0..100)
            .map(|_| tokio::spawn(client.get(format!("{url}/hold")).send()))
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        for request in &waiting {
            request.abort();
        }
        for request in waiting {
            let _ = request.await;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while limit.available() < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "permits not returned"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The client still connects: nothing is left holding the bound.
        let response = tokio::time::timeout(
            Duration::from_secs(10),
            client.get(format!("{url}/quick")).send(),
        )
        .await
        .expect("a request after the cancelled burst connects")
        .unwrap();
        assert_eq!(response.text().await.unwrap(), "ok");
        assert!(
            accepted.load(Ordering::SeqCst) < 100,
            "the cancelled did not all connect"
        );
        release.send_replace(true);
    }
}
