//! `policy.networking.k8s.io/v1alpha2` ClusterNetworkPolicy as the API serves it (standard
//! channel): hand-written serde types with the CRD's field names. Fields the typed model does not
//! know are kept (`other`) so that the policy compiler can refuse them by name
//! (`policy/cluster.rs`, docs/policy.md "ClusterNetworkPolicy").

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const API_VERSION: &str = "policy.networking.k8s.io/v1alpha2";
pub const KIND: &str = "ClusterNetworkPolicy";

/// Fields the typed model does not know (the experimental channel's above all): kept to be
/// refused by name.
pub type Other = BTreeMap<String, Value>;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterNetworkPolicy {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ClusterNetworkPolicySpec,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Subject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<CnpRule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<CnpRule>>,
    #[serde(flatten)]
    pub other: Other,
}

/// `spec.subject`: exactly one of `namespaces`, `pods`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<PodsSelector>,
    #[serde(flatten)]
    pub other: Other,
}

/// `pods`: pods of the namespaces a selector picks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodsSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    #[serde(flatten)]
    pub other: Other,
}

/// An ingress (`from`) or egress (`to`) rule.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CnpRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Vec<CnpPeer>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Vec<CnpPeer>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocols: Option<Vec<CnpProtocol>>,
    #[serde(flatten)]
    pub other: Other,
}

/// A peer: exactly one of `namespaces`, `pods`, `networks` (egress only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CnpPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<PodsSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks: Option<Vec<String>>,
    #[serde(flatten)]
    pub other: Other,
}

/// A protocol match: exactly one of `tcp`, `udp`, `sctp`, `destinationNamedPort`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CnpProtocol {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<ProtocolPort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<ProtocolPort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sctp: Option<ProtocolPort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_named_port: Option<String>,
    #[serde(flatten)]
    pub other: Other,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_port: Option<DestinationPort>,
    #[serde(flatten)]
    pub other: Other,
}

/// Exactly one of `number`, `range`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DestinationPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<PortRange>,
    #[serde(flatten)]
    pub other: Other,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortRange {
    #[serde(default)]
    pub start: i64,
    #[serde(default)]
    pub end: i64,
    #[serde(flatten)]
    pub other: Other,
}

impl k8s_openapi::Resource for ClusterNetworkPolicy {
    const API_VERSION: &'static str = API_VERSION;
    const GROUP: &'static str = "policy.networking.k8s.io";
    const KIND: &'static str = KIND;
    const VERSION: &'static str = "v1alpha2";
    const URL_PATH_SEGMENT: &'static str = "clusternetworkpolicies";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::ListableResource for ClusterNetworkPolicy {
    const LIST_KIND: &'static str = "ClusterNetworkPolicyList";
}

impl k8s_openapi::Metadata for ClusterNetworkPolicy {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
