//! Building a [`RegionalStore`]: the regions, the settings and what they must hold.

use super::*;

impl fmt::Debug for RegionalStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.regions.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("RegionalStoreBuilder")
            .field("own", &self.own)
            .field("regions", &names)
            .field("share", &self.share)
            .finish_non_exhaustive()
    }
}

impl RegionalStoreBuilder {
    /// How long granted units live in a region's pool unless told otherwise (`L`).
    pub const DEFAULT_LIFETIME: Duration = Duration::from_millis(500);
    /// Units a cold key may be admitted on credit in a region unless told otherwise (`b`).
    pub const DEFAULT_BORROW: u32 = 1;
    /// How long the home (or another region) may go unanswered before a region decides from
    /// its share, unless told otherwise.
    pub const DEFAULT_DETECT_AFTER: Duration = Duration::from_millis(1_000);
    /// The least time ahead of need a pool is refilled, unless told otherwise (at least three
    /// round trips to the home).
    pub const DEFAULT_LEAD: Duration = Duration::from_millis(100);

    /// A region and its Redis, in the same order in every region; the first one listed is
    /// the home, which keeps the exact algorithm.
    pub fn region(mut self, name: impl Into<String>, store: RedisStore) -> Self {
        self.regions.push((name.into(), store));
        self
    }

    /// The share `F` of each key's limit (rate and burst) this region may use while it cannot
    /// reach the others: 0 < F ≤ 1, by default 1 / the number of regions.
    pub fn share(mut self, share: f64) -> Self {
        self.share = Some(share);
        self
    }

    /// How long granted units live in this region's pool (`L`, default 500 ms): a unit not spent
    /// by then is lost (it was counted at the home). The bound grows by `ρ·L`; a longer
    /// lifetime means fewer, larger grants.
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }

    /// Units a cold key (no pool in this region) may be admitted on credit before its first
    /// grant arrives (`b`, default 1; 0: none), charged at the home with that grant.
    pub fn borrow(mut self, units: u32) -> Self {
        self.borrow = units;
        self
    }

    /// How long the home (or, for the home region, another region) may go unanswered before
    /// this region decides from its share (default 1 s; heartbeats go four times as often).
    pub fn detect_after(mut self, detect_after: Duration) -> Self {
        self.detect_after = detect_after;
        self
    }

    /// The least time ahead of need a pool is refilled (default 100 ms; at least three
    /// measured round trips to the home), and the least time between two grants while the
    /// key has less than the regions ask for. Give every region the same, at least the longest
    /// round trip between a region and the home.
    pub fn lead(mut self, lead: Duration) -> Self {
        self.lead = lead;
        self
    }

    /// Validates the settings and starts the heartbeats; the error names the field. Must be
    /// called inside a Tokio runtime.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first setting that cannot work (`regions`, `region`,
    /// `share`, `lifetime`, `detect_after`, `lead`), or `runtime` outside a Tokio runtime.
    pub fn build(self) -> Result<RegionalStore, ConfigError> {
        let (own, share) = self.check()?;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(ConfigError::new(
                "runtime",
                "a RegionalStore is built inside a Tokio runtime (its heartbeats run there)",
            ));
        };
        let inner = Arc::new(Inner {
            regions: self
                .regions
                .into_iter()
                .map(|(name, store)| Peer {
                    name,
                    store,
                    last_ok_ms: AtomicU64::new(NEVER),
                })
                .collect(),
            own,
            share,
            lifetime_us: self.lifetime.as_micros() as u64,
            borrow: self.borrow,
            detect: self.detect_after,
            lead_us: self.lead.as_micros() as u64,
            rtt_us: AtomicU64::new(0),
            home_ping_us: AtomicU64::new(0),
            first_grants_awaited: AtomicU64::new(0),
            cut: AtomicBool::new(false),
            cuts: AtomicU64::new(0),
            grants: AtomicU64::new(0),
            units_granted: AtomicU64::new(0),
            units_charged: AtomicU64::new(0),
            failed_grants: AtomicU64::new(0),
            units_dropped: AtomicU64::new(0),
            owed: Mutex::new(HashMap::new()),
            refills: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
        });
        runtime.spawn(heartbeats(Arc::downgrade(&inner)));
        Ok(RegionalStore { inner })
    }

    /// Checks the settings: this region's index among the regions, and its share.
    fn check(&self) -> Result<(usize, f64), ConfigError> {
        if self.regions.is_empty() {
            return Err(ConfigError::new("regions", "list at least one region"));
        }
        for (i, (name, _)) in self.regions.iter().enumerate() {
            if name.is_empty() || name.contains([',', '=']) || name.chars().any(char::is_whitespace)
            {
                return Err(ConfigError::new(
                    "regions",
                    format!("{name:?} is not a region name (no commas, '=' or spaces)"),
                ));
            }
            if self.regions[..i].iter().any(|(n, _)| n == name) {
                return Err(ConfigError::new(
                    "regions",
                    format!("region {name:?} is listed twice"),
                ));
            }
        }
        let Some(own) = self.regions.iter().position(|(n, _)| *n == self.own) else {
            return Err(ConfigError::new(
                "region",
                format!("{:?} is not one of the regions listed", self.own),
            ));
        };
        let share = self.share.unwrap_or(1.0 / self.regions.len() as f64);
        if !(share.is_finite() && share > 0.0 && share <= 1.0) {
            return Err(ConfigError::new(
                "share",
                format!("must be in (0, 1], got {share}"),
            ));
        }
        if self.lifetime < Duration::from_millis(10) || self.lifetime > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "lifetime",
                "must be between 10 ms and one hour",
            ));
        }
        if self.detect_after < Duration::from_millis(20)
            || self.detect_after > Duration::from_secs(600)
        {
            return Err(ConfigError::new(
                "detect_after",
                "must be between 20 ms and ten minutes",
            ));
        }
        if self.lead > Duration::from_secs(60) {
            return Err(ConfigError::new("lead", "must be at most a minute"));
        }
        Ok((own, share))
    }
}
