//! The lines of a backend's dump (`kpxctl rules`) that mention a traced destination,
//! whatever the backend wrote: nft set and map elements as `map: element`, iptables rules
//! as they are.

/// The rules of a dump that mention the traced destination: nft set and map elements as
/// `map: element`, iptables rules as they are.
pub fn matching_rules(dump: &str, packet: &kpx_proto::trace::Packet) -> Vec<String> {
    let (ip, port, proto) = (packet.destination.ip(), packet.destination.port(), packet.protocol);
    let nft = format!("{ip} . {proto} . {port}");
    let host = if ip.is_ipv4() { format!("{ip}/32") } else { format!("{ip}/128") };
    let iptables = format!("-d {host} -p {proto} -m {proto} --dport {port} ");
    let mut collection = "";
    let mut out = Vec::new();
    for line in dump.lines() {
        let trimmed = line.trim();
        if let Some(rest) = trimmed.strip_prefix("map ").or_else(|| trimmed.strip_prefix("set ")) {
            collection = rest.trim_end_matches('{').trim();
        }
        if trimmed.contains(&iptables) {
            out.push(trimmed.to_owned());
        } else if trimmed.contains(&nft) {
            let element = trimmed.trim_start_matches("elements = {").trim_end_matches(['}', ',']).trim();
            for one in element.split(", ").filter(|e| e.contains(&nft)) {
                out.push(format!("{collection}: {one}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_proto::admin::TraceRequest;
    use kpx_proto::trace::Packet;
    use kpx_proto::types::Protocol;

    #[test]
    fn finds_the_rule_of_a_destination_in_either_backend_text() {
        let packet = Packet {
            destination: "10.96.0.10:80".parse().expect("addr"),
            protocol: Protocol::Tcp,
            source: None,
        };
        let nft = "\t\telements = { 10.96.0.10 . tcp . 80 : goto pick-v4-2,\n\t\t\t     10.96.0.11 . tcp . 80 : goto pick-v4-1 }";
        let nft = format!("\tmap service-ips-v4 {{\n{nft}");
        assert_eq!(matching_rules(&nft, &packet), ["service-ips-v4: 10.96.0.10 . tcp . 80 : goto pick-v4-2"]);
        let ipt = "-A KPX-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -m comment --comment \"a/b:http cluster IP\" -j KPX-SVC-X\n-A KPX-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 8080 -j Y";
        assert_eq!(matching_rules(ipt, &packet).len(), 1);
        let bad = TraceRequest { destination: "nope".into(), ..Default::default() };
        assert!(Packet::from_request(&bad).is_err());
        let v6 = TraceRequest {
            destination: "[fd00::1]:53".into(),
            protocol: "UDP".into(),
            source: String::new(),
        };
        assert!(Packet::from_request(&v6).is_ok());
    }
}
