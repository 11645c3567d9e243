package simulate

import (
	"encoding/json"

	"github.com/traceops/trace/schemas"
)

func fn(name, desc, params string) schemas.Tool {
	if !json.Valid([]byte(params)) {
		panic("simulate: invalid parameters of tool " + name)
	}
	return schemas.Tool{Type: "function", Function: schemas.FunctionDef{Name: name, Description: desc, Parameters: json.RawMessage(params)}}
}

var airlineTools = []schemas.Tool{
	fn("book_reservation", "Book a reservation.",
		`{"type":"object","properties":{
		 "user_id":{"type":"string","description":"The ID of the user to book the reservation such as 'sara_doe_496'."},
		 "origin":{"type":"string","description":"The IATA code for the origin city such as 'SFO'."},
		 "destination":{"type":"string","description":"The IATA code for the destination city such as 'JFK'."},
		 "flight_type":{"type":"string","enum":["one_way","round_trip"]},
		 "cabin":{"type":"string","enum":["basic_economy","economy","business"]},
		 "flights":{"type":"array","description":"An array of objects containing details about each piece of flight.","items":{"type":"object","properties":{"flight_number":{"type":"string","description":"Flight number, such as 'HAT001'."},"date":{"type":"string","description":"The date for the flight in the format 'YYYY-MM-DD', such as '2024-05-01'."}},"required":["flight_number","date"]}},
		 "passengers":{"type":"array","items":{"type":"object","properties":{"first_name":{"type":"string"},"last_name":{"type":"string"},"dob":{"type":"string","description":"The date of birth of the passenger in the format 'YYYY-MM-DD'."}},"required":["first_name","last_name","dob"]}},
		 "payment_methods":{"type":"array","items":{"type":"object","properties":{"payment_id":{"type":"string","description":"The payment id stored in user profile, such as 'credit_card_7815826', 'gift_card_7815826', 'certificate_7815826'."},"amount":{"type":"number"}},"required":["payment_id","amount"]}},
		 "total_baggages":{"type":"integer"},
		 "nonfree_baggages":{"type":"integer"},
		 "insurance":{"type":"string","enum":["yes","no"]}},
		 "required":["user_id","origin","destination","flight_type","cabin","flights","passengers","payment_methods","total_baggages","nonfree_baggages","insurance"]}`),
	fn("calculate", "Calculate the result of a mathematical expression.",
		`{"type":"object","properties":{"expression":{"type":"string","description":"The mathematical expression to calculate, such as '2 + 2'."}},"required":["expression"]}`),
	fn("cancel_reservation", "Cancel the whole reservation.",
		`{"type":"object","properties":{"reservation_id":{"type":"string","description":"The reservation ID, such as 'ZFA04Y'."}},"required":["reservation_id"]}`),
	fn("get_flight_status", "Get the status of a flight.",
		`{"type":"object","properties":{"flight_number":{"type":"string"},"date":{"type":"string"}},"required":["flight_number","date"]}`),
	fn("get_reservation_details", "Get the details of a reservation.",
		`{"type":"object","properties":{"reservation_id":{"type":"string","description":"The reservation ID, such as '8JX2WO'."}},"required":["reservation_id"]}`),
	fn("get_user_details", "Get the details of a user, including their reservations.",
		`{"type":"object","properties":{"user_id":{"type":"string","description":"The user ID, such as 'sara_doe_496'."}},"required":["user_id"]}`),
	fn("list_all_airports", "Returns a list of all available airports.", `{"type":"object","properties":{}}`),
	fn("search_direct_flight", "Search for direct flights between two cities on a specific date.",
		`{"type":"object","properties":{"origin":{"type":"string"},"destination":{"type":"string"},"date":{"type":"string","description":"The date of the flight in the format 'YYYY-MM-DD'."}},"required":["origin","destination","date"]}`),
	fn("search_onestop_flight", "Search for one-stop flights between two cities on a specific date.",
		`{"type":"object","properties":{"origin":{"type":"string"},"destination":{"type":"string"},"date":{"type":"string"}},"required":["origin","destination","date"]}`),
	fn("send_certificate", "Send a certificate to a user. Be careful!",
		`{"type":"object","properties":{"user_id":{"type":"string"},"amount":{"type":"integer","description":"The amount of the certificate to send."}},"required":["user_id","amount"]}`),
	fn("transfer_to_human_agents", "Transfer the user to a human agent, with a summary of the user's issue. Only transfer if the user explicitly asks for a human agent, or the request cannot be handled within the policy and the available tools.",
		`{"type":"object","properties":{"summary":{"type":"string","description":"A summary of the user's issue."}},"required":["summary"]}`),
	fn("update_reservation_baggages", "Update the baggage information of a reservation.",
		`{"type":"object","properties":{"reservation_id":{"type":"string"},"total_baggages":{"type":"integer"},"nonfree_baggages":{"type":"integer"},"payment_id":{"type":"string","description":"The payment id stored in user profile, such as 'credit_card_7815826', 'gift_card_7815826', 'certificate_7815826'."}},"required":["reservation_id","total_baggages","nonfree_baggages","payment_id"]}`),
	fn("update_reservation_flights", "Update the flight information of a reservation.",
		`{"type":"object","properties":{"reservation_id":{"type":"string"},"cabin":{"type":"string","enum":["basic_economy","economy","business"]},"flights":{"type":"array","description":"An array of objects containing details about each piece of flight in the ENTIRE new reservation. Even if the a flight segment is not changed, it should still be included in the array.","items":{"type":"object","properties":{"flight_number":{"type":"string"},"date":{"type":"string"}},"required":["flight_number","date"]}},"payment_id":{"type":"string"}},"required":["reservation_id","cabin","flights","payment_id"]}`),
	fn("update_reservation_passengers", "Update the passenger information of a reservation.",
		`{"type":"object","properties":{"reservation_id":{"type":"string"},"passengers":{"type":"array","items":{"type":"object","properties":{"first_name":{"type":"string"},"last_name":{"type":"string"},"dob":{"type":"string"}},"required":["first_name","last_name","dob"]}}},"required":["reservation_id","passengers"]}`),
}

var retailTools = []schemas.Tool{
	fn("calculate", "Calculate the result of a mathematical expression.",
		`{"type":"object","properties":{"expression":{"type":"string","description":"The mathematical expression to calculate, such as '2 + 2'."}},"required":["expression"]}`),
	fn("cancel_pending_order", "Cancel a pending order. If the order is already processed or delivered, it cannot be cancelled. The agent needs to explain the cancellation detail and ask for explicit user confirmation (yes/no) to proceed.",
		`{"type":"object","properties":{"order_id":{"type":"string","description":"The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning of the order id."},"reason":{"type":"string","enum":["no longer needed","ordered by mistake"]}},"required":["order_id","reason"]}`),
	fn("exchange_delivered_order_items", "Exchange items in a delivered order to new items of the same product type. For a delivered order, return or exchange can be only done once by the agent.",
		`{"type":"object","properties":{"order_id":{"type":"string"},"item_ids":{"type":"array","items":{"type":"string"},"description":"The item ids to be exchanged, each such as '1008292230'."},"new_item_ids":{"type":"array","items":{"type":"string"},"description":"The item ids to be exchanged for, each such as '1008292230'. There could be duplicate items in the list."},"payment_method_id":{"type":"string","description":"The payment method id to pay or receive refund for the item price difference, such as 'gift_card_0000000' or 'credit_card_0000000'."}},"required":["order_id","item_ids","new_item_ids","payment_method_id"]}`),
	fn("find_user_id_by_email", "Find user id by email. If the user is not found, the function will return an error message.",
		`{"type":"object","properties":{"email":{"type":"string","description":"The email of the user, such as 'something@example.com'."}},"required":["email"]}`),
	fn("find_user_id_by_name_zip", "Find user id by first name, last name, and zip code. If the user is not found, the function will return an error message.",
		`{"type":"object","properties":{"first_name":{"type":"string"},"last_name":{"type":"string"},"zip":{"type":"string"}},"required":["first_name","last_name","zip"]}`),
	fn("get_order_details", "Get the status and details of an order.",
		`{"type":"object","properties":{"order_id":{"type":"string","description":"The order id, such as '#W0000000'."}},"required":["order_id"]}`),
	fn("get_product_details", "Get the inventory details of a product.",
		`{"type":"object","properties":{"product_id":{"type":"string","description":"The product id, such as '6086499569'. Be careful the product id is different from the item id."}},"required":["product_id"]}`),
	fn("get_user_details", "Get the details of a user, including their orders.",
		`{"type":"object","properties":{"user_id":{"type":"string","description":"The user id, such as 'sara_doe_496'."}},"required":["user_id"]}`),
	fn("list_all_product_types", "List the name and product id of all product types.", `{"type":"object","properties":{}}`),
	fn("modify_pending_order_address", "Modify the shipping address of a pending order.",
		`{"type":"object","properties":{"order_id":{"type":"string"},"address1":{"type":"string"},"address2":{"type":"string"},"city":{"type":"string"},"state":{"type":"string"},"country":{"type":"string"},"zip":{"type":"string"}},"required":["order_id","address1","address2","city","state","country","zip"]}`),
	fn("modify_pending_order_items", "Modify items in a pending order to new items of the same product type. For a pending order, this function can only be called once.",
		`{"type":"object","properties":{"order_id":{"type":"string"},"item_ids":{"type":"array","items":{"type":"string"}},"new_item_ids":{"type":"array","items":{"type":"string"}},"payment_method_id":{"type":"string"}},"required":["order_id","item_ids","new_item_ids","payment_method_id"]}`),
	fn("modify_pending_order_payment", "Modify the payment method of a pending order.",
		`{"type":"object","properties":{"order_id":{"type":"string"},"payment_method_id":{"type":"string"}},"required":["order_id","payment_method_id"]}`),
	fn("modify_user_address", "Modify the default address of a user.",
		`{"type":"object","properties":{"user_id":{"type":"string"},"address1":{"type":"string"},"address2":{"type":"string"},"city":{"type":"string"},"state":{"type":"string"},"country":{"type":"string"},"zip":{"type":"string"}},"required":["user_id","address1","address2","city","state","country","zip"]}`),
	fn("return_delivered_order_items", "Return some items of a delivered order. The order status will be changed to 'return requested'.",
		`{"type":"object","properties":{"order_id":{"type":"string"},"item_ids":{"type":"array","items":{"type":"string"}},"payment_method_id":{"type":"string","description":"The payment method id to receive the refund, such as 'gift_card_0000000'. It should be the original payment method or a gift card."}},"required":["order_id","item_ids","payment_method_id"]}`),
	fn("transfer_to_human_agents", "Transfer the user to a human agent, with a summary of the user's issue. Only transfer if the user explicitly asks for a human agent, or the request cannot be handled within the policy and the available tools.",
		`{"type":"object","properties":{"summary":{"type":"string","description":"A summary of the user's issue."}},"required":["summary"]}`),
}
