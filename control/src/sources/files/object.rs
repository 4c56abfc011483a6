//! One decoded document into kxdp's objects: the kind chosen by `apiVersion` and `kind`, lists
//! unpacked, the API server's defaults applied, and every error naming the object and the field.
//! Used by the plain reader (`mod.rs`) and the parallel one (`documents.rs`) alike.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::model::Object;

pub(super) type DocError = (Option<String>, String, String);

/// Decodes one document (or list item, `prefix` being its path) into objects.
pub(super) fn decode_document(
    doc: Value,
    prefix: &str,
    validate: bool,
    out: &mut Vec<Object>,
) -> Result<(), DocError> {
    let map = match &doc {
        Value::Null => return Ok(()),
        Value::Object(m) => m,
        other => {
            return Err((
                None,
                prefix.trim_end_matches('.').to_string(),
                format!("expected an object, found {}", json_type(other)),
            ))
        }
    };
    let str_field = |name: &str| -> Result<String, DocError> {
        match map.get(name) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(Value::String(_)) | None => {
                Err((None, format!("{prefix}{name}"), "missing".into()))
            }
            Some(other) => Err((
                None,
                format!("{prefix}{name}"),
                format!("expected a string, found {}", json_type(other)),
            )),
        }
    };
    let api_version = str_field("apiVersion")?;
    let kind = str_field("kind")?;
    let label = object_label(&kind, map);

    if kind == "List" || (kind.ends_with("List") && map.contains_key("items")) {
        let items = match map.get("items") {
            None | Some(Value::Null) => return Ok(()),
            Some(Value::Array(a)) => a.clone(),
            Some(other) => {
                return Err((
                    Some(label),
                    format!("{prefix}items"),
                    format!("expected a list, found {}", json_type(other)),
                ))
            }
        };
        for (i, item) in items.into_iter().enumerate() {
            decode_document(item, &format!("{prefix}items[{i}]."), validate, out)?;
        }
        return Ok(());
    }

    let decode = DecodeCtx {
        prefix,
        label: &label,
    };
    let obj = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Node") => Object::Node(decode.typed(doc)?),
        ("v1", "Namespace") => Object::Namespace(decode.typed(doc)?),
        ("v1", "Pod") => Object::Pod(decode.typed(doc)?),
        ("v1", "Service") => Object::Service(decode.typed(doc)?),
        ("discovery.k8s.io/v1", "EndpointSlice") => Object::EndpointSlice(decode.typed(doc)?),
        ("networking.k8s.io/v1", "NetworkPolicy") => Object::NetworkPolicy(decode.typed(doc)?),
        ("networking.k8s.io/v1", "ServiceCIDR") => Object::ServiceCidr(decode.typed(doc)?),
        (
            crate::model::cluster_network_policy::API_VERSION,
            crate::model::cluster_network_policy::KIND,
        ) => Object::ClusterNetworkPolicy(decode.typed(doc)?),
        _ => {
            tracing::debug!(api_version, kind, object = %label, "ignoring object of a kind kxdp does not use");
            return Ok(());
        }
    };
    out.push(finish(obj, prefix, &label, validate)?);
    Ok(())
}

/// A decoded object with the API server's defaults (name required, namespace `default`) and,
/// when `validate`, the checks of `crate::validate`.
pub(super) fn finish(
    obj: Object,
    prefix: &str,
    label: &str,
    validate: bool,
) -> Result<Object, DocError> {
    let decode = DecodeCtx { prefix, label };
    let obj = with_defaults(obj, &decode)?;
    let invalid = match &obj {
        Object::Service(s) if validate => crate::validate::service(s),
        Object::EndpointSlice(s) if validate => crate::validate::endpoint_slice(s),
        _ => Vec::new(),
    };
    if let Some(e) = invalid.into_iter().next() {
        return Err(decode.err(&e.field, e.message));
    }
    Ok(obj)
}

struct DecodeCtx<'a> {
    prefix: &'a str,
    label: &'a str,
}

impl DecodeCtx<'_> {
    fn typed<T: DeserializeOwned>(&self, doc: Value) -> Result<Box<T>, DocError> {
        serde_path_to_error::deserialize::<_, T>(doc)
            .map(Box::new)
            .map_err(|e| {
                let path = e.path().to_string();
                let field = if path == "." {
                    self.prefix.trim_end_matches('.').to_string()
                } else {
                    format!("{}{path}", self.prefix)
                };
                (
                    Some(self.label.to_string()),
                    field,
                    e.into_inner().to_string(),
                )
            })
    }

    fn err(&self, field: &str, message: impl Into<String>) -> DocError {
        (
            Some(self.label.to_string()),
            format!("{}{field}", self.prefix),
            message.into(),
        )
    }
}

/// Names and namespaces, as the API server guarantees them.
fn with_defaults(mut obj: Object, ctx: &DecodeCtx<'_>) -> Result<Object, DocError> {
    let (meta, namespaced) = match &mut obj {
        Object::Node(o) => (&mut o.metadata, false),
        Object::Namespace(o) => (&mut o.metadata, false),
        Object::ServiceCidr(o) => (&mut o.metadata, false),
        Object::ClusterNetworkPolicy(o) => (&mut o.metadata, false),
        Object::Pod(o) => (&mut o.metadata, true),
        Object::Service(o) => (&mut o.metadata, true),
        Object::EndpointSlice(o) => (&mut o.metadata, true),
        Object::NetworkPolicy(o) => (&mut o.metadata, true),
    };
    if meta.name.as_deref().unwrap_or("").is_empty() {
        return Err(ctx.err("metadata.name", "missing"));
    }
    if namespaced {
        if meta.namespace.as_deref().unwrap_or("").is_empty() {
            meta.namespace = Some("default".into());
        }
    } else {
        meta.namespace = None;
    }
    Ok(obj)
}

fn object_label(kind: &str, map: &serde_json::Map<String, Value>) -> String {
    let meta = map.get("metadata");
    let get = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_str);
    match (get("namespace"), get("name")) {
        (Some(ns), Some(n)) => format!("{kind} {ns}/{n}"),
        (None, Some(n)) => format!("{kind} {n}"),
        _ => kind.to_string(),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
