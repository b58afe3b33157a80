//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does
//! it: the holder renews the lease; another candidate takes it over once it has seen the
//! same record unchanged for a whole lease duration (its own clock, so clocks need not
//! agree). Every write carries the resourceVersion it read, so two candidates never both
//! win.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

/// Where the lease lives and who is asking.
#[derive(Debug, Clone)]
pub struct Election {
    /// The lease's namespace.
    pub namespace: String,
    /// The lease's name.
    pub name: String,
    /// This candidate's identity (host name and PID by default).
    pub identity: String,
    /// How long a lease holds without renewal.
    pub duration: Duration,
}

impl Election {
    /// How often the holder renews and a candidate retries.
    pub fn period(&self) -> Duration {
        self.duration / 5
    }
}

/// A candidate's view of the lease.
pub struct Candidate {
    api: Api<Lease>,
    election: Election,
    /// The record last seen and when it was first seen unchanged.
    observed: Option<(String, Instant)>,
}

/// What one attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// This candidate holds the lease.
    Leader,
    /// Another holds it.
    Follower(String),
}

impl Candidate {
    /// A candidate for `election`.
    pub fn new(client: kube::Client, election: Election) -> Self {
        Candidate {
            api: Api::namespaced(client, &election.namespace),
            election,
            observed: None,
        }
    }

    fn spec(&self, transitions: i32) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.election.identity.clone()),
            lease_duration_seconds: Some(self.election.duration.as_secs().max(1) as i32),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One attempt to take or renew the lease.
    pub async fn try_lead(&mut self) -> Result<Standing, kube::Error> {
        let pp = PostParams::default();
        let Some(mut lease) = self.api.get_opt(&self.election.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.election.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(0)),
            };
            return match self.api.create(&pp, &lease).await {
                Ok(_) => Ok(Standing::Leader),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    Ok(Standing::Follower("another candidate".into()))
                }
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let record = format!(
            "{holder}@{:?}",
            spec.renew_time.as_ref().map(|t| t.0.to_string())
        );
        let now = Instant::now();
        let unchanged_since = match &self.observed {
            Some((r, since)) if *r == record => *since,
            _ => now,
        };
        self.observed = Some((record, unchanged_since));
        let ours = holder == self.election.identity;
        let expired =
            holder.is_empty() || now.duration_since(unchanged_since) >= self.election.duration;
        if !ours && !expired {
            return Ok(Standing::Follower(holder));
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
        let mut next = self.spec(transitions);
        if ours {
            next.acquire_time = spec.acquire_time;
        }
        lease.spec = Some(next);
        match self.api.replace(&self.election.name, &pp, &lease).await {
            Ok(_) => Ok(Standing::Leader),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Standing::Follower(holder)),
            Err(e) => Err(e),
        }
    }

    /// Waits until this candidate holds the lease.
    pub async fn acquire(&mut self) {
        let mut said = String::new();
        loop {
            match self.try_lead().await {
                Ok(Standing::Leader) => {
                    tracing::info!(lease = %self.election.name, "leading");
                    return;
                }
                Ok(Standing::Follower(holder)) => {
                    if holder != said {
                        tracing::info!(lease = %self.election.name, %holder, "standing by");
                        said = holder;
                    }
                }
                Err(e) => tracing::warn!(lease = %self.election.name, "lease: {e}"),
            }
            tokio::time::sleep(self.election.period()).await;
        }
    }

    /// Renews the lease until it is lost: returns when another candidate took it or it
    /// could not be renewed for a whole lease duration.
    pub async fn hold(&mut self) -> String {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.election.period()).await;
            match self.try_lead().await {
                Ok(Standing::Leader) => renewed = Instant::now(),
                Ok(Standing::Follower(holder)) => return format!("{holder} took the lease"),
                Err(e) => {
                    tracing::warn!(lease = %self.election.name, "renewing the lease: {e}");
                    if renewed.elapsed() >= self.election.duration {
                        return format!(
                            "the lease could not be renewed for {:?}",
                            self.election.duration
                        );
                    }
                }
            }
        }
    }
}
