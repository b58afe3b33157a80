//! Test support: a controller on redb in a temporary directory, run on a thread of the
//! test process (in the calling thread's network namespace), stopped and removed on drop.

/// A running in-process controller.
pub struct InProcess {
    /// Its base URL.
    pub url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), corvid_controller::ServeError>>>,
    _dir: tempfile::TempDir,
}

impl InProcess {
    /// Starts one on a free loopback port and waits until it answers.
    pub fn start() -> InProcess {
        let dir = tempfile::tempdir().unwrap();
        let listen = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let store = format!("redb:{}", dir.path().join("state.redb").display());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            corvid_controller::run(
                corvid_controller::Config {
                    listen,
                    store,
                    token: None,
                    tls: None,
                    max_body: corvid_controller::DEFAULT_MAX_BODY,
                    client_timeout: corvid_controller::DEFAULT_CLIENT_TIMEOUT,
                },
                async move {
                    let _ = stopped.await;
                },
            )
        });
        let url = format!("http://{listen}");
        let start = std::time::Instant::now();
        while ureq::get(&format!("{url}/v2.0")).call().is_err() {
            assert!(
                start.elapsed().as_secs() < 20,
                "the controller did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        InProcess {
            url,
            stop: Some(stop),
            thread: Some(thread),
            _dir: dir,
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
