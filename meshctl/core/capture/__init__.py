"""Traffic capture as data: settings -> rule sets (IPv4/IPv6) -> iptables-restore text, and back.

Pure: nothing here touches the kernel, the environment or files. ``meshctl.net`` applies what this
package computes; ``meshctl iptables`` wires the two together.
"""
