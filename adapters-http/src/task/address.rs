//! Which hosts and addresses an `http` task may reach
//! (docs/design/handlers.md#address-safety): a definition must not be able
//! to read the cloud metadata service or other link-local endpoints through
//! a worker, neither by naming them nor through a name that resolves (or
//! later rebinds) to them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Metadata services' IPv4 addresses: most clouds' (link-local anyway, but
/// named as what it is) and Alibaba's, outside 169.254.0.0/16.
const METADATA_V4: [Ipv4Addr; 2] = [Ipv4Addr::new(169, 254, 169, 254), Ipv4Addr::new(100, 100, 100, 200)];
/// AWS's metadata service over IPv6.
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254);
/// Names that reach a metadata service through the platform's own DNS.
const METADATA_NAMES: [&str; 2] = ["metadata.google.internal", "metadata"];

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddressKind {
    /// 169.254.0.0/16 or fe80::/10.
    LinkLocal,
    /// A cloud provider's instance metadata service.
    Metadata,
}

impl fmt::Display for AddressKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::LinkLocal => "a link-local address",
            Self::Metadata => "a cloud metadata address",
        })
    }
}

/// Whether `ip` is one no task may reach unless its host is allowed by
/// name. IPv4 carried in IPv6 (mapped, or NAT64's well-known prefix) is
/// judged as the IPv4 address it reaches.
pub(crate) fn classify(ip: IpAddr) -> Option<AddressKind> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped().or_else(|| nat64(v6)) {
                classify_v4(v4)
            } else if v6 == METADATA_V6 {
                Some(AddressKind::Metadata)
            } else if v6.segments()[0] & 0xffc0 == 0xfe80 {
                Some(AddressKind::LinkLocal)
            } else {
                None
            }
        }
    }
}

fn classify_v4(v4: Ipv4Addr) -> Option<AddressKind> {
    if METADATA_V4.contains(&v4) {
        Some(AddressKind::Metadata)
    } else if v4.is_link_local() {
        Some(AddressKind::LinkLocal)
    } else {
        None
    }
}

/// The IPv4 address behind 64:ff9b::/96, which a NAT64 gateway reaches.
fn nat64(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    match v6.segments() {
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo))),
        _ => None,
    }
}

/// A URL's host as compared: an address, or a lower-case name without its
/// trailing dot (`metadata.` reaches `metadata`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Ip(IpAddr),
    Name(String),
}

impl Host {
    fn parse(host: &str) -> Self {
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        match bare.parse::<IpAddr>() {
            Ok(ip) => Self::Ip(ip),
            Err(_) => Self::Name(bare.trim_end_matches('.').to_ascii_lowercase()),
        }
    }
}

/// A host or address a task may not reach.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// `allow_hosts` is set and does not name the host.
    #[error("{host} is not one of the allowed hosts")]
    NotAllowed {
        /// The URL's host.
        host: String,
    },
    /// The host is a metadata service's name.
    #[error("{host} is a cloud metadata host")]
    MetadataName {
        /// The URL's host.
        host: String,
    },
    /// The host is a refused address.
    #[error("{host} is {kind}")]
    Address {
        /// The URL's host.
        host: String,
        /// Why.
        kind: AddressKind,
    },
    /// The host resolves only to refused addresses.
    #[error("{host} resolves to {kind} ({ip})")]
    Resolved {
        /// The URL's host.
        host: String,
        /// The first refused address.
        ip: IpAddr,
        /// Why.
        kind: AddressKind,
    },
}

/// The hosts a task may reach: `None` for any host but the refused ones.
#[derive(Debug, Clone, Default)]
pub(crate) struct AllowList {
    only: Option<Vec<Host>>,
}

impl AllowList {
    /// From `HttpTaskOptions::allow_hosts`; an entry that is neither an
    /// address nor a host name is returned as the error.
    pub(crate) fn new(hosts: Option<&[String]>) -> Result<Self, String> {
        let Some(hosts) = hosts else { return Ok(Self::default()) };
        let only = hosts
            .iter()
            .map(|entry| match Host::parse(entry.trim()) {
                Host::Name(name)
                    if name.is_empty()
                        || !name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')) =>
                {
                    Err(entry.clone())
                }
                host => Ok(host),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { only: Some(only) })
    }

    /// Whether `host` is named in the list: then nothing else is checked.
    fn names(&self, host: &Host) -> bool {
        self.only.as_ref().is_some_and(|only| only.contains(host))
    }

    /// Checks a URL's host (as `Url::host_str` gives it) before anything
    /// is sent. An address is checked here because reqwest connects to an
    /// IP literal without resolving it; a name's addresses are checked by
    /// [`GuardedResolver`] at connection time.
    pub(crate) fn check_host(&self, host: &str) -> Result<(), Refused> {
        let parsed = Host::parse(host);
        if self.names(&parsed) {
            return Ok(());
        }
        if self.only.is_some() {
            return Err(Refused::NotAllowed { host: host.to_owned() });
        }
        match parsed {
            Host::Ip(ip) => match classify(ip) {
                Some(kind) => Err(Refused::Address {
                    host: host.to_owned(),
                    kind,
                }),
                None => Ok(()),
            },
            Host::Name(name) if METADATA_NAMES.contains(&name.as_str()) => {
                Err(Refused::MetadataName { host: host.to_owned() })
            }
            Host::Name(_) => Ok(()),
        }
    }

    /// The addresses `host` resolved to that may be connected to: all of
    /// them for an allowed host, else those not refused. None left is a
    /// refusal naming the first address dropped.
    pub(crate) fn filter_resolved(
        &self,
        host: &str,
        addrs: impl IntoIterator<Item = SocketAddr>,
    ) -> Result<Vec<SocketAddr>, Refused> {
        if self.names(&Host::parse(host)) {
            return Ok(addrs.into_iter().collect());
        }
        self.check_host(host)?;
        let mut refused = None;
        let kept: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|addr| match classify(addr.ip()) {
                Some(kind) => {
                    refused.get_or_insert((addr.ip(), kind));
                    false
                }
                None => true,
            })
            .collect();
        match (kept.is_empty(), refused) {
            (true, Some((ip, kind))) => Err(Refused::Resolved {
                host: host.to_owned(),
                ip,
                kind,
            }),
            _ => Ok(kept),
        }
    }
}

/// Resolves names for the task's client and drops refused addresses, so
/// the check holds for the addresses actually connected to: a name that
/// passed once cannot rebind to the metadata service afterwards.
#[derive(Debug)]
pub(crate) struct GuardedResolver {
    pub(crate) allow: Arc<AllowList>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow = Arc::clone(&self.allow);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let kept = allow.filter_resolved(&host, found)?;
            let addrs: Addrs = Box::new(kept.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn addresses_are_classified() {
        use AddressKind::{LinkLocal, Metadata};
        for (ip, expected) in [
            ("169.254.169.254", Some(Metadata)),
            ("100.100.100.200", Some(Metadata)),
            ("fd00:ec2::254", Some(Metadata)),
            ("::ffff:169.254.169.254", Some(Metadata)),
            ("64:ff9b::a9fe:a9fe", Some(Metadata)),
            ("169.254.0.1", Some(LinkLocal)),
            ("169.254.255.255", Some(LinkLocal)),
            ("fe80::1", Some(LinkLocal)),
            ("febf::1", Some(LinkLocal)),
            ("::ffff:169.254.1.1", Some(LinkLocal)),
            ("127.0.0.1", None),
            ("::1", None),
            ("10.0.0.1", None),
            ("192.168.1.1", None),
            ("100.100.100.201", None),
            ("169.253.255.255", None),
            ("169.255.0.0", None),
            ("fec0::1", None),
            ("fd00:ec2::253", None),
            ("2001:db8::1", None),
            ("::ffff:127.0.0.1", None),
        ] {
            let parsed: IpAddr = ip.parse().unwrap();
            assert_eq!(classify(parsed), expected, "{ip}");
        }
    }

    proptest! {
        #[test]
        fn a_mapped_address_is_judged_as_its_ipv4(bits: u32) {
            let v4 = Ipv4Addr::from(bits);
            prop_assert_eq!(classify(IpAddr::V6(v4.to_ipv6_mapped())), classify(IpAddr::V4(v4)));
            prop_assert_eq!(classify(IpAddr::V4(v4)).is_some(), v4.octets()[..2] == [169, 254] || v4 == METADATA_V4[1]);
        }
    }

    fn list(hosts: &[&str]) -> AllowList {
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        AllowList::new(Some(&hosts)).unwrap()
    }

    #[test]
    fn hosts_are_checked_against_the_defaults_and_the_list() {
        let any = AllowList::default();
        for ok in ["127.0.0.1", "example.com", "[::1]", "10.1.2.3", "metadata.example.com"] {
            assert_eq!(any.check_host(ok), Ok(()), "{ok}");
        }
        for refused in [
            "169.254.169.254",
            "[fe80::1]",
            "[::ffff:a9fe:a9fe]",
            "[fd00:ec2::254]",
            "metadata",
            "metadata.google.internal",
            "metadata.google.internal.",
        ] {
            assert!(any.check_host(refused).is_err(), "{refused}");
        }

        let only = list(&["API.example.com", "169.254.169.254", "[fe80::1]", "metadata"]);
        for ok in [
            "api.example.com",
            "api.example.com.",
            "169.254.169.254",
            "[fe80::1]",
            "metadata",
        ] {
            assert_eq!(only.check_host(ok), Ok(()), "{ok}");
        }
        assert_eq!(
            only.check_host("127.0.0.1"),
            Err(Refused::NotAllowed {
                host: "127.0.0.1".into()
            })
        );
        assert!(only.check_host("other.example.com").is_err());
        assert!(only.check_host("169.254.169.253").is_err());
    }

    #[test]
    fn bad_allow_list_entries_are_refused() {
        for bad in [
            "",
            "http://example.com",
            "exa mple.com",
            "host/path",
            "ex\u{e4}mple.com",
        ] {
            assert_eq!(AllowList::new(Some(&[bad.to_owned()])).unwrap_err(), bad);
        }
    }

    #[test]
    fn resolved_addresses_are_filtered_unless_the_name_is_allowed() {
        let addr = |s: &str| SocketAddr::new(s.parse().unwrap(), 0);
        let (public, local) = (addr("93.184.216.34"), addr("169.254.169.254"));
        let any = AllowList::default();
        assert_eq!(any.filter_resolved("a.example", [local, public]), Ok(vec![public]));
        assert_eq!(
            any.filter_resolved("a.example", [local]),
            Err(Refused::Resolved {
                host: "a.example".into(),
                ip: local.ip(),
                kind: AddressKind::Metadata
            })
        );
        assert!(any.filter_resolved("metadata.google.internal", [public]).is_err());
        let only = list(&["a.example"]);
        assert_eq!(only.filter_resolved("a.example", [local]), Ok(vec![local]));
        assert!(only.filter_resolved("b.example", [public]).is_err());
    }
}
