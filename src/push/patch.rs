//! What a write does to a record's value: a JSON merge patch (RFC 7396), and one member set
//! through a path of object keys.

use serde_json::Value;

/// Applies a JSON merge patch (RFC 7396) to `target`.
pub fn merge_patch(target: &mut Value, patch: Value) {
    let Value::Object(patch) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let obj = target.as_object_mut().expect("made an object");
    for (k, v) in patch {
        if v.is_null() {
            obj.remove(&k);
        } else {
            merge_patch(obj.entry(k).or_insert(Value::Null), v);
        }
    }
}

/// Sets the member at `path` (object keys, objects made where missing) to `v`; or the part of
/// the path (joined by `/`) that leads to a value that is not an object.
pub fn set_member(target: &mut Value, path: &[String], v: Value) -> Result<(), String> {
    let mut at = target;
    for (i, key) in path.iter().enumerate() {
        let Value::Object(obj) = at else {
            return Err(path[..i].join("/"));
        };
        at = obj
            .entry(key.clone())
            .or_insert(Value::Object(Default::default()));
    }
    *at = v;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7396() {
        // The examples of RFC 7396 appendix A.
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (mut t, p, want) in cases {
            merge_patch(&mut t, p);
            assert_eq!(t, want);
        }
    }

    #[test]
    fn members_are_set_through_objects_only() {
        let mut v = json!({"a": {"b": 1}, "n": 3});
        set_member(&mut v, &["a".into(), "c".into()], json!(2)).unwrap();
        set_member(&mut v, &["x".into(), "y".into()], json!(true)).unwrap();
        assert_eq!(v, json!({"a": {"b": 1, "c": 2}, "n": 3, "x": {"y": true}}));
        assert_eq!(
            set_member(&mut v, &["n".into(), "z".into()], json!(0)),
            Err("n".to_string())
        );
    }
}
